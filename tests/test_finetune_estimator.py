"""Fine-tuning in the estimator and the planner: full, LoRA, QLoRA and FSDP2 CPU offload. Hand-worked numbers
(the arithmetic is in the comments), the rules, the host-RAM rule, the decision tree and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.arrays import ConfigArrays
from meshplan.estimator.batch import GIB, estimate_arrays
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.physics import finetune
from meshplan.estimator.physics.layout import layout_of
from meshplan.planner.search import plan_search
from meshplan.planner.space import SearchSpace
from meshplan.planner.tree import decision_tree

H100 = load_hardware("h100-sxm")
TT = load_stack("torchtitan")
L70 = load_model("llama3-70b")
L8 = load_model("llama3-8b")
BASE = dict(gpus=16, seq_len=4096, global_batch_size=32, ac="full")


def run(model=L70, hw=H100, **kw):
    return estimate(model, hw, TrainConfig(**{**BASE, **kw}))


def arrays(model=L70, **kw):
    cfg = TrainConfig(**{**BASE, **kw}).resolve(model, H100)
    return estimate_arrays(model, H100, TT, ConfigArrays.from_configs([cfg]))


def test_lora_adapters_by_hand():
    # Llama 3 70B (h 8192, kv 1024, F 28672, 80 layers), r 16 on every linear:
    # q, o: 16 (8192 + 8192) each; k, v: 16 (8192 + 1024) each; w1, w2, w3: 16 (8192 + 28672) each
    per_layer = 2 * 16 * (8192 + 8192) + 2 * 16 * (8192 + 1024) + 3 * 16 * (8192 + 28672)
    assert finetune.adapter_params(L70, 16, ("q", "k", "v", "o", "w1", "w2", "w3")) == 80 * per_layer == 207_093_760
    # torchtune's 70B recipe (q, v, output_proj and the MLP): 16 (8192 + 8192) x 2 + 16 (8192 + 1024) + MLP
    assert finetune.adapter_params(L70, 16, ("q", "v", "o", "w1", "w2", "w3")) == 80 * (per_layer - 16 * 9216)


def test_done_when_figures_70b_on_16_gpus():
    full, lora, qlora = run(finetune="full"), run(finetune="lora", lora_rank=16), run(finetune="qlora", lora_rank=16)
    offload = run(finetune="full", cpu_offload=True)
    assert lora["model"]["trainable_params"] / lora["model"]["params"] < 0.01
    assert full["model"]["trainable_params"] == full["model"]["params"]
    assert lora["memory"]["peak_gib"] < 0.5 * full["memory"]["peak_gib"]
    assert qlora["memory"]["peak_gib"] < lora["memory"]["peak_gib"]
    assert offload["memory"]["peak_gib"] < 0.5 * full["memory"]["peak_gib"]
    # offload moves 16 bytes a parameter (fp32 weights, gradients, both AdamW moments) to the host: 8 ranks a node
    # each holding N / 16 of them
    moved = 8 * 16 * L70.params / 16 / GIB
    assert offload["memory"]["host_ram_offloaded_gib_per_node"] == pytest.approx(moved, rel=1e-3)
    assert offload["memory"]["breakdown_gib"]["params_fp32"] == 0 and offload["memory"]["breakdown_gib"]["optimizer_states"] == 0
    assert full["memory"]["host_ram_offloaded_gib_per_node"] == 0
    # the CPU's AdamW: 36 bytes a parameter over the node's DRAM (614 GB/s x 0.4, shared by 8 ranks), + its dispatch
    # on DTensors (FSDP2's sharded parameters: 0.5 ms a block, measured on one H100)
    step = 36 * L70.params / 16 / (614e9 * 0.4 / 8) + 80 * load_stack("torchtitan").dtensor_optimizer_s_per_layer
    assert offload["throughput"]["breakdown_s"]["optimizer_step"] == pytest.approx(step, rel=1e-3)
    assert offload["throughput"]["breakdown_s"]["offload_exposed"] > 0


def test_frozen_weights_by_hand():
    r = arrays(finetune="lora")
    assert r["frozen_params"][0] == pytest.approx(2 * L70.params / 16)  # bf16 over 16 FSDP ranks
    assert r["params_fp32"][0] == pytest.approx(4 * 207_093_760 / 16)
    assert r["optimizer_states"][0] == pytest.approx(8 * 207_093_760 / 16)
    q = arrays(finetune="qlora")
    # the blocks' linears in NF4 (0.515747 B), the embedding, output and norms in bf16
    linears = 80 * finetune.block_linear_params(L70)
    expect = (linears * finetune.NF4_BYTES + (L70.params - linears) * 2) / 16
    assert q["frozen_params"][0] == pytest.approx(expect, rel=1e-6)
    assert finetune.NF4_BYTES == pytest.approx(0.515747, abs=1e-6)


def test_lora_activation_deltas_by_hand():
    lay = layout_of(ConfigArrays.from_configs([TrainConfig(**BASE, finetune="lora").resolve(L70, H100)]))
    none, sel = finetune.lora_saved_delta(L70, lay)
    r = 16
    assert none[0] == 7 * 2 * r  # every linear's A output (bf16); each input is saved for the adapters anyway
    # op-SAC counts base, A, B of each linear: q (1 s, 2 r, 3 s), k (4 r, 5 s, 6 r), v (7 s, 8 r, 9 s), o (10 r,
    # 11 s, 12 r), w1 (13 s, 14 r, 15 s), w3 (16 r, 17 s, 18 r), w2 (19 s, 20 r, 21 s): B outputs of q, v, w1, w2
    # and the A outputs of k, o, w3 join the base outputs the dense block saves
    assert sel[0] == 2 * 8192 + 2 * 1024 + 2 * 28672 + 2 * 8192 + 3 * 2 * r
    # only the MLP adapted: the attention norm's output and the attention output wo reads are read by frozen
    # linears only and are not saved
    lay2 = layout_of(ConfigArrays.from_configs([TrainConfig(**BASE, finetune="lora", lora_targets=("w1", "w2", "w3"))
                                                .resolve(L70, H100)]))
    none2, _ = finetune.lora_saved_delta(L70, lay2)
    assert none2[0] == 3 * 2 * r - 2 * 8192 - 2 * 8192


def test_lora_compute_skips_frozen_weight_gradients():
    full, lora = arrays(finetune="full"), arrays(finetune="lora")
    # the frozen linears' backward computes the input gradient only: 2 of 3 GEMMs (the attention unchanged)
    assert lora["compute"][0] < full["compute"][0]
    assert lora["mfu"][0] < full["mfu"][0] * 1.05
    q = arrays(finetune="qlora")
    assert q["nf4_dequant"][0] > 0 and lora["nf4_dequant"][0] == 0


def test_pretraining_unchanged_by_the_finetune_fields():
    a = arrays()
    b = arrays(finetune="full")  # same weights train: the same GPU figures
    for key in ("peak_bytes", "step_time_s", "params_fp32", "activations"):
        assert a[key][0] == pytest.approx(b[key][0])
    assert a["frozen_params"][0] == 0 and a["nf4_dequant"][0] == 0 and a["offload_exposed"][0] == 0


@pytest.mark.parametrize("kw, needle", [
    (dict(finetune="lora", tp=2), "FSDP only"),
    (dict(finetune="qlora", tp=1, pp=2, global_batch_size=32), "FSDP only"),
    (dict(finetune="lora", float8="tensorwise"), "float8 none"),
    (dict(cpu_offload=True, tp=2), "CPU offload"),
    (dict(cpu_offload=True, float8="rowwise"), "CPU offload with Float8"),
])
def test_rules(kw, needle):
    with pytest.raises(MeshplanError, match=needle):
        run(**kw)


def test_lora_refuses_moe_and_counts_experts_for_full():
    qwen = load_model("qwen3-30b-a3b")
    with pytest.raises(MeshplanError, match="mixture-of-experts"):
        estimate(qwen, H100, TrainConfig(gpus=8, seq_len=4096, global_batch_size=8, finetune="lora"))
    full = estimate(qwen, H100, TrainConfig(gpus=8, seq_len=4096, global_batch_size=8, finetune="full"))
    assert full["model"]["trainable_params"] == qwen.params


def test_nf4_block_rule():
    tiny = load_model("llama3-8b").model_copy(update={"hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
                                                      "layers": 2, "vocab": 256, "name": "tiny"})
    with pytest.raises(MeshplanError, match="NF4 blocks"):
        estimate(tiny, H100, TrainConfig(gpus=2, seq_len=64, global_batch_size=2, finetune="qlora"))


def test_plan_each_mode_on_two_nodes_and_explains():
    for mode in ("full", "lora", "qlora"):
        res = plan_search(L70, H100, TT, 16, 8, 4096, 32, space=SearchSpace(finetune=mode))
        assert len(res.ranked), mode
        tree = decision_tree(res)
        assert tree[0]["key"] == "finetune"
        text = tree[0]["reason"]
        assert "full fine-tuning does not fit on 16 GPUs" in text and "full + CPU offload fits at" in text
        assert "LoRA fits at" in text and "QLoRA fits at" in text, text
        best = res.config(int(res.ranked[0]))
        assert best["finetune"] == mode
        if mode == "full":  # only offload fits: the plan offloads, and the tree's offload step says so
            assert best["cpu_offload"]
        else:  # LoRA fits without it: offload is not taken where it is not needed
            assert not best["cpu_offload"]


def test_host_ram_rule_rejects_with_reason():
    small = H100.model_copy(update={"host_ram_gib_per_node": 512, "id": "h100-512g"})
    res = plan_search(L70, small, TT, 16, 8, 4096, 32, space=SearchSpace(finetune="full"))
    host = np.flatnonzero(res.reason == 30)
    assert len(host)
    assert "host RAM" in res.reason_text(int(host[0])) and "512" in res.reason_text(int(host[0]))
    tree = decision_tree(res)
    assert "above this node's 512 GiB" in tree[0]["reason"]
    if len(res.ranked) == 0:
        from meshplan.planner.search import explain_empty

        assert "host RAM" in explain_empty(res)


def test_cli_estimate_json_and_errors(cli):
    out = cli("estimate", "--model", "llama3-70b", "--gpus", "16", "--seq-len", "4096", "--global-batch-size", "32",
              "--ac", "full", "--finetune", "lora", "--lora-rank", "16", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["model"]["trainable_params"] == 207_093_760
    assert r["config"]["finetune"] == "lora" and r["config"]["lora_targets"] == ["q", "k", "v", "o", "w1", "w2", "w3"]
    out = cli("estimate", "--model", "llama3-70b", "--gpus", "16", "--finetune", "lora", "--lora-targets", "q_proj,wx")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--lora-targets" in out.stderr, out.stderr
    out = cli("estimate", "--model", "llama3-70b", "--gpus", "16", "--finetune", "lora", "--lora-rank", "0")
    assert out.returncode == 2 and "--lora-rank" in out.stderr and "Traceback" not in out.stderr
    out = cli("estimate", "--model", "llama3-70b", "--gpus", "16", "--seq-len", "4096", "--global-batch-size", "32",
              "--ac", "full", "--finetune", "full", "--cpu-offload")
    assert out.returncode == 0 and "offloaded state" in out.stdout, out.stdout


def test_cli_plan_writes_finetune_section(cli, tmp_path):
    plan = tmp_path / "plan.yaml"
    out = cli("plan", "--model", "llama3-70b", "--nodes", "2", "--seq-len", "4096", "--global-batch-size", "32",
              "--finetune", "qlora", "--init-from", "/ckpt/Llama-3.1-70B", "-o", str(plan))
    assert out.returncode == 0, out.stderr
    assert "Fine-tuning mode" in out.stdout
    from meshplan.planner.plan_file import load_plan

    p = load_plan(plan)
    assert p.finetune.mode == "qlora" and p.finetune.init_from == "/ckpt/Llama-3.1-70B"
    # torchtune's LoRA recipe defaults, not pre-training's
    assert (p.training.optimizer.lr, p.training.optimizer.weight_decay) == (3e-4, 0.01)
    assert p.training.lr_schedule.warmup_steps == 100
    rel = tmp_path / "rel.yaml"  # a relative --init-from is stored absolute: the ranks start elsewhere
    out = cli("plan", "--model", "llama3-8b", "--nodes", "1", "--finetune", "full", "--init-from", "ckpt/l8b",
              "-o", str(rel), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    p = load_plan(rel)
    assert p.finetune.init_from == str(tmp_path / "ckpt" / "l8b") and p.training.optimizer.lr == 2e-5
    again = cli("estimate", "--plan", str(plan), "--json")
    assert json.loads(again.stdout)["config"]["finetune"] == "qlora"
