"""Traced memory mode (launcher/trace.py): real fake-tensor traces of 2-layer shapes held to the analytical
model. Each trace runs in a few seconds on one CPU core; no mocking of the traced code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rich.console import Console

from meshplan.commands.trace import render
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.stack import load_stack
from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.trace import trace_config
from meshplan.launcher.trace_compare import analytical_terms, compare, embedding_partial_bytes

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
HW = load_hardware("h100-sxm")
STACK = load_stack("torchtitan")
# Llama-shaped (GQA, SwiGLU), 2 layers; dims divide every degree used below, so FSDP pads nothing
SPEC = ModelSpec(name="trace-2l", layers=2, hidden=512, heads=8, kv_heads=4, ffn_hidden=1536, vocab=2048)
# the same shape with MoE MLPs: 8 routed experts, top-2, a shared expert (both layers MoE)
MOE_SPEC = ModelSpec.model_validate({**SPEC.model_dump(), "name": "trace-moe-2l", "moe": {
    "experts": 8, "top_k": 2, "expert_ffn_hidden": 512, "shared_ffn_hidden": 512}})


def cfg(dp_shard: int, tp: int = 1, pp: int = 1, ac: str = "selective", model: ModelSpec = SPEC, **kw) -> RunConfig:
    micro = 2 * pp if pp > 1 else 1
    return RunConfig.from_dict({
        "model": model.model_dump(), "dp_shard": dp_shard, "tp": tp, "pp": pp, "ac": ac, "seq_len": 1024,
        "micro_batch_size": 1, "global_batch_size": dp_shard * micro, **kw,
    })


CASES = {
    "fsdp-none": cfg(4, ac="none"),
    "fsdp-selective": cfg(4, ac="selective"),
    "fsdp-full": cfg(4, ac="full"),
    "tp-sp-none": cfg(2, tp=2, ac="none"),
    "tp-sp-selective": cfg(2, tp=2, ac="selective"),
    "tp-sp-full": cfg(2, tp=2, ac="full"),
    "pp-1f1b-none": cfg(2, pp=2, ac="none"),
    "pp-1f1b-selective": cfg(2, pp=2, ac="selective"),
    # GPipe: the last stage holds every microbatch's head inputs and saved loss (fp32 log-softmax) until the backwards
    "pp-gpipe-none": cfg(2, pp=2, ac="none", pp_schedule="GPipe"),
    # mixture of experts (routed round-robin in the trace): FSDP only, EP 4 (no expert FSDP), EP 2 (experts
    # FSDP-sharded over the other 2 ranks), EP with TP (ep carved from dp_shard x tp), every AC mode
    "moe-fsdp-none": cfg(4, ac="none", model=MOE_SPEC),
    "moe-fsdp-selective": cfg(4, ac="selective", model=MOE_SPEC),
    "moe-ep4-selective": cfg(4, ac="selective", model=MOE_SPEC, ep=4),
    "moe-ep4-full": cfg(4, ac="full", model=MOE_SPEC, ep=4),
    "moe-ep2-none": cfg(4, ac="none", model=MOE_SPEC, ep=2),
    "moe-tp2-ep2-selective": cfg(2, tp=2, ac="selective", model=MOE_SPEC, ep=2),
    # fine-tuning: LoRA r16 on every linear (frozen bf16 weights, fp32 adapters), each AC mode; LoRA on the MLP
    # only; full fine-tuning with FSDP2 CPU offload (traced without it: `offloaded` is what leaves the GPU)
    "lora-fsdp-none": cfg(4, ac="none", finetune="lora", lora_rank=16),
    "lora-fsdp-selective": cfg(4, ac="selective", finetune="lora", lora_rank=16),
    "lora-fsdp-full": cfg(4, ac="full", finetune="lora", lora_rank=16),
    "lora-mlp-none": cfg(4, ac="none", finetune="lora", lora_rank=8, lora_targets=["w1", "w2", "w3"]),
    "offload-fsdp-selective": cfg(4, ac="selective", finetune="full", cpu_offload=True),
    # training dtype bfloat16: the model built in bf16 (params, grads, AdamW state 2 bytes each), with FSDP, with
    # TP and with a pipeline
    "bf16-fsdp-selective": cfg(4, ac="selective", dtype="bfloat16"),
    "bf16-tp-sp-none": cfg(2, tp=2, ac="none", dtype="bfloat16"),
    "bf16-pp-1f1b-selective": cfg(2, pp=2, ac="selective", dtype="bfloat16"),
    # torchtitan's fsdp_reshard_after_forward: never (every block's gathered weights kept until its backward) and
    # always on a pipeline (stages reshard after forward; torch's pipelining keeps them gathered after backward)
    "fsdp-never-selective": cfg(4, ac="selective", fsdp_reshard_after_forward="never"),
    "pp-always-selective": cfg(2, pp=2, ac="selective", fsdp_reshard_after_forward="always"),
    # FSDP2 on a mesh of one shard (torchtitan since 2026-04, the current stack): one GPU, and TP alone
    "one-rank-selective": cfg(1, ac="selective", fsdp_one_rank=True),
    "one-rank-tp2-none": cfg(1, tp=2, ac="none", fsdp_one_rank=True),
    # one device without FSDP (torchtitan 0.2.2, the torchtitan-2026-03 stack): fp32 weights under torch.autocast,
    # whose bf16 weight copies are cached to the loss and saved for backward (compared as activations)
    "autocast-one-device-none": cfg(1, ac="none"),
    "autocast-one-device-selective": cfg(1, ac="selective"),
    "autocast-one-device-full": cfg(1, ac="full"),
}
OLD_STACK = {name: load_stack("torchtitan-2026-03") for name in CASES if name.startswith("autocast-")}
_CACHE: dict[str, object] = {}


def stack_of(name: str):
    """The stack whose rules the case's layout runs by (the core follows its plan's)."""
    return OLD_STACK.get(name, STACK)


def traced(name: str):
    if name not in _CACHE:
        _CACHE[name] = trace_config(CASES[name])
    return _CACHE[name]


@pytest.mark.parametrize("name", list(CASES))
def test_state_bytes_equal_closed_form(name):
    """Sharded fp32 params and grads, and AdamW state (+ its 4-byte step counter per parameter tensor),
    are exactly the analytical model's closed form, on every traced rank (both PP stages)."""
    result = traced(name)
    assert len(result.ranks) == (2 if CASES[name].pp > 1 else 1)
    for r in result.ranks:
        a = analytical_terms(CASES[name], HW, stack_of(name), r.pp_rank)
        assert r.state["params"] == int(a["params_fp32"] + a["frozen_params"])  # LoRA: frozen weights too
        assert r.state["grads"] == int(a["grads_after_backward"])
        assert r.state["optimizer"] == int(a["optimizer_states"]) + 4 * r.param_tensors
        assert r.peak["params"] == r.state["params"]  # bf16 compute copies are never counted as params


@pytest.mark.parametrize("name", list(CASES))
def test_activations_within_10_percent(name):
    """Saved activations (what a forward leaves for backward, in-flight microbatches included, the head's
    final-norm and output-projection inputs on the last stage too) agree with the analytical model within
    10 %."""
    result = traced(name)
    for r in result.ranks:
        a = analytical_terms(CASES[name], HW, stack_of(name), r.pp_rank)
        model = a["saved_activations"] + a["weight_copies"]  # autocast's copies: saved tensors to the trace
        assert r.saved_activations > 0
        assert model == pytest.approx(r.saved_activations, rel=0.10), (name, r.pp_rank)


@pytest.mark.parametrize("name", list(CASES))
def test_total_tensor_memory_within_10_percent(name):
    """The analytical allocated peak (the larger of the loss, block-backward and end-of-backward phases,
    `estimator/batch.py`) agrees with the traced step-2 peak within 10 %, on every traced rank."""
    for row in compare(traced(name), HW, stack_of(name)):
        err = row["error"]["total"]
        assert abs(err) <= 0.10, (name, row["pp_rank"], err)


def test_ac_ordering_and_tp_sharding():
    """Activation checkpointing and TP change what the trace sees the way they should."""
    act = {n: traced(n).ranks[0].saved_activations for n in ("fsdp-none", "fsdp-selective", "fsdp-full")}
    assert act["fsdp-none"] > 2 * act["fsdp-selective"] > 2 * act["fsdp-full"]
    assert traced("tp-sp-none").ranks[0].saved_activations < act["fsdp-none"]
    pp = traced("pp-1f1b-selective").ranks
    assert pp[0].saved_activations > pp[1].saved_activations  # 1F1B: stage 0 holds 2 microbatches


def test_reshard_policy_moves_the_gathered_weights_as_fsdp2_does():
    """fsdp_reshard_after_forward never: FSDP2 keeps every block's gathered weights from its forward to its
    backward, so the traced peak holds the whole model's bf16 weights, as the model says, where the default policy's
    peak holds a block's. always on a pipeline: the stage's forward reshards, but its backward (torch's pipelining
    sets reshard_after_backward False) leaves the whole stage gathered, and the model has that too."""
    default, never = traced("fsdp-selective").ranks[0], traced("fsdp-never-selective").ranks[0]
    whole = 2 * SPEC.params  # bf16, every rank
    assert never.peak["unsharded_params"] == whole
    assert default.peak["unsharded_params"] < 0.7 * whole
    (row,) = compare(traced("fsdp-never-selective"), HW, STACK)
    assert row["analytical"]["unsharded_params"] == whole
    for r, row in zip(traced("pp-always-selective").ranks, compare(traced("pp-always-selective"), HW, STACK),
                      strict=True):
        stage_whole = row["traced"]["params"]  # the stage's fp32 shard over dp_shard 2: its bf16 weights' bytes
        assert r.peak["unsharded_params"] == pytest.approx(stage_whole, rel=0.01)
        assert row["analytical"]["unsharded_params"] >= stage_whole


def test_moe_trace_routes_round_robin_and_ep_shards_the_experts():
    """The MoE trace says how it routed, and expert parallelism divides the experts' state as the model does."""
    result = traced("moe-ep4-selective")
    assert any("round-robin" in n for n in result.notes)
    fsdp, ep4 = traced("moe-fsdp-selective").ranks[0], result.ranks[0]
    assert fsdp.state["params"] == ep4.state["params"]  # FSDP alone or EP: every rank keeps 1/4 of all state
    assert ep4.category_max["unsharded_params"] < fsdp.category_max["unsharded_params"]  # 2 experts, not 8


def test_tp_pp_first_stage_holds_a_full_vocabulary_embedding_gradient():
    """The -51 % trace-grid row (README): with TP and PP, DTensor's embedding backward yields a Partial
    gradient of the whole vocabulary (bf16, per microbatch), which FSDP2 accumulates unsharded in fp32
    across the no-sync microbatches. With a vocabulary large enough to dominate, stage 0's temporaries
    hold both full-vocabulary buffers, twice what a vocabulary-sharded (vocab / tp) gradient would take;
    `embedding_partial_bytes` is what the fp32 accumulation adds beyond the model's TP-local share (the bf16
    partial is in the model's end of backward)."""
    vocab, h = 65536, SPEC.hidden
    big_vocab = SPEC.model_copy(update={"vocab": vocab}).model_dump()
    c = RunConfig.from_dict({**cfg(2, tp=2, pp=2, ac="full").dump(), "model": big_vocab})
    first = next(r for r in trace_config(c).ranks if r.pp_rank == 0)
    assert first.category_max["temporaries"] >= (4 + 2) * vocab * h
    assert embedding_partial_bytes(c, 0) == 4 * vocab * h // 2
    assert embedding_partial_bytes(c, 1) == 0  # the last stage's output projection is vocab-sharded
    assert embedding_partial_bytes(CASES["tp-sp-selective"], 0) == 0  # no PP: one microbatch, no no-sync


def test_bf16_training_dtype_halves_the_state():
    """Training dtype bfloat16: params, grads and AdamW moments half the fp32 run's bytes (the step counters stay
    fp32), the compute copies FSDP all-gathers are the same bf16."""
    bf16, fp32 = traced("bf16-fsdp-selective").ranks[0], traced("fsdp-selective").ranks[0]
    for key in ("params", "grads"):
        assert bf16.state[key] == fp32.state[key] // 2
    assert bf16.state["optimizer"] - 4 * bf16.param_tensors == (fp32.state["optimizer"] - 4 * fp32.param_tensors) // 2
    assert bf16.category_max["unsharded_params"] == fp32.category_max["unsharded_params"]


def test_dtypes_are_the_gpu_runs():
    """bf16 compute params under FSDP: the largest all-gathered buffer is 2 bytes per parameter."""
    r = traced("fsdp-selective").ranks[0]
    root = 2 * 2 * SPEC.vocab * SPEC.hidden  # embedding + output, bf16
    assert r.category_max["unsharded_params"] >= root
    assert r.category_max["unsharded_params"] < 4 * (root + 2 * SPEC.block_params)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"float8": "tensorwise"}, "float8"),
        ({"cp": 2, "global_batch_size": 2, "dp_shard": 1}, "context parallel"),
    ],
)
def test_untraceable_configs_raise_one_line(overrides, message):
    with pytest.raises(MeshplanError, match=message) as exc:
        trace_config(RunConfig.from_dict({**cfg(2).dump(), **overrides}))
    assert "\n" not in str(exc.value)


def test_interleaved_pipeline_is_refused():
    deeper = SPEC.model_copy(update={"layers": 4}).model_dump()
    c = RunConfig.from_dict({**cfg(1, pp=2, global_batch_size=4).dump(), "model": deeper,
                             "pp_schedule": "Interleaved1F1B", "vpp": 2})
    with pytest.raises(MeshplanError, match="Interleaved1F1B"):
        trace_config(c)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshplan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_trace_json_and_errors(tmp_path):
    plan = tmp_path / "plan.yaml"
    made = _cli("estimate", "--model", "examples/tiny-llama/config.json", "--gpus", "4", "--tp", "2",
                "--seq-len", "64", "--global-batch-size", "2", "--ac", "full", "-o", str(plan))
    assert made.returncode == 0, made.stderr
    out = _cli("trace", str(plan), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["config"]["tp"] == 2 and report["config"]["dp_shard"] == 2
    row = report["ranks"][0]
    assert row["traced"]["params"] == row["analytical"]["params"]
    assert any("fragmentation" in n for n in report["notes"])
    assert row["unmodelled_embedding_gradient"] == 0  # TP without PP: nothing beyond the model
    console = Console(record=True, width=120)
    render(report, console)
    text = console.export_text()
    assert "MiB per GPU" in text and "GiB per GPU" not in text  # a tiny model reads in MiB
    missing = _cli("trace", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "plan file not found" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_cli_traces_a_bf16_plan(tmp_path):
    """`meshplan trace` of a plan with training dtype bfloat16 traces the bf16 model and compares it with the bf16
    estimate: the state is exact, and the report says bf16."""
    plan = tmp_path / "plan.yaml"
    made = _cli("estimate", "--model", "examples/tiny-llama/config.json", "--gpus", "2", "--seq-len", "64",
                "--global-batch-size", "2", "--dtype", "bfloat16", "-o", str(plan))
    assert made.returncode == 0, made.stderr
    out = _cli("trace", str(plan), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["config"]["dtype"] == "bfloat16" and any("bfloat16" in n for n in report["notes"])
    row = report["ranks"][0]
    for key in ("params", "grads", "optimizer"):
        assert row["traced"][key] == row["analytical"][key], key
    console = Console(record=True, width=140)
    render(report, console)
    text = console.export_text()
    assert "training dtype bfloat16" in text and "params (bf16, sharded)" in text


def test_help_does_not_import_torch():
    code = "import sys; from meshplan.cli import app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_lora_trace_holds_frozen_weights_and_adapter_state():
    """LoRA: the traced sharded parameters are the frozen bf16 weights and the fp32 adapters (exactly the model's
    frozen + trainable bytes); gradients and AdamW state are the adapters' only."""
    lora, full = traced("lora-fsdp-selective").ranks[0], traced("fsdp-selective").ranks[0]
    a = analytical_terms(CASES["lora-fsdp-selective"], HW, STACK, 0)
    assert lora.state["params"] == int(a["frozen_params"] + a["params_fp32"])
    assert a["frozen_params"] == pytest.approx(full.state["params"] / 2, rel=0.01)  # bf16 instead of fp32
    assert lora.state["grads"] == int(a["grads_after_backward"]) < full.state["grads"] / 10
    assert lora.param_tensors == 2 * 2 * 7  # AdamW holds the adapters alone: 2 layers x 7 linears x (A, B)


def test_cpu_offload_trace_shows_what_leaves_the_gpu():
    """CPU offload: the traced sharded state is exactly what the model puts in host RAM per rank, and the GPU peak
    without it agrees with the model's offload peak within 10 %."""
    rows = compare(traced("offload-fsdp-selective"), HW, STACK)
    for row in rows:
        off = row["offload"]
        assert off["error"]["offloaded"] == pytest.approx(0.0, abs=1e-9)
        assert abs(off["error"]["total"]) <= 0.10
        assert off["traced"]["total"] < row["traced"]["total"] / 1.4


def test_ddp_replicas_trace_under_autocast_with_the_buckets_left_analytical():
    """dp_replicate as the whole mesh on the torchtitan-2026-03 stack (0.2.2's DDP): traced under autocast as the
    GPU run is; DDP itself is not applied under fake tensors, so its gradient buckets (a copy of every fp32 gradient)
    leave the analytical grads and total, and the state and activation rows then agree. (The totals are not compared:
    the trace's peak is a forward's, without buckets, where the estimate's is the optimizer step's.)"""
    c = cfg(1, ac="selective", dp_replicate=2, global_batch_size=2)
    assert c.ddp
    result = trace_config(c)
    assert any("DDP is not applied in the trace" in n for n in result.notes)
    assert any("DDP replicas" in n and "torch.autocast" in n for n in result.notes)
    (row,) = compare(result, HW, OLD_STACK["autocast-one-device-selective"])
    a = analytical_terms(c, HW, OLD_STACK["autocast-one-device-selective"], 0)
    assert row["analytical"]["grads"] == pytest.approx(a["grads_after_backward"] / 2)  # 4 bytes + 4 of buckets
    for key in ("params", "grads", "optimizer"):
        assert abs(row["error"][key]) < 1e-3, (key, row["error"])
    assert abs(row["error"]["activations"]) <= 0.10, row["error"]
