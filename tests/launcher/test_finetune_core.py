"""Fine-tuning in the training core, on real processes (torchrun, gloo) and real safetensors files: a tiny model
pre-trained by the core and written out as a Hugging Face checkpoint (`meshplan export-weights`), then LoRA,
QLoRA (torchao NF4), full fine-tuning and FSDP2 CPU offload from it; the user's path (`meshplan estimate -o`,
`meshplan launch --init-from`, `meshplan export-weights`); and a truncated checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from launchtools import ROOT, TINY_MODEL, child_env, config, run_cases, train
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

TINY = {**TINY_MODEL, "name": "tiny-ft", "layers": 2}
# QLoRA's NF4 blocks (64 x 256 values) need every linear's FSDP shard to be whole blocks: a wider tiny model
TINY_Q = {**TINY, "name": "tiny-qlora", "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 512}
TEXT = str(ROOT / "README.md")  # bytes of real text: a model learns them, unlike the synthetic stream
ADAPTERS = ("lora_a.weight", "lora_b.weight")


def meshplan(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshplan", *args], cwd=cwd or ROOT, env=child_env(COLUMNS="200"),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny Llama pre-trained for 30 steps on text by the core (FSDP 2), exported as an HF checkpoint; and one
    of the QLoRA width, pre-trained for 10."""
    tmp = tmp_path_factory.mktemp("pretrain")
    out = {}
    for name, model, steps in (("tiny", TINY, 30), ("wide", TINY_Q, 10)):
        run_dir = tmp / f"run-{name}"
        cfg = config(run_dir, model=model, dp_shard=2, steps=steps, lr=3e-3, warmup_steps=2, data=TEXT,
                     checkpoint_interval=steps)
        proc = train(2, cfg, tmp / f"{name}.json", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        hf = tmp / f"hf-{name}"
        exp = meshplan("export-weights", str(run_dir), "-o", str(hf), "--dtype", "float32")
        assert exp.returncode == 0, exp.stderr
        out[name] = (hf, losses)
    return out


def test_lora_qlora_full_and_offload_from_a_checkpoint(pretrained, tmp_path):
    (hf, pre_losses), (hf_q, _) = pretrained["tiny"], pretrained["wide"]
    common = dict(dp_shard=2, steps=6, warmup_steps=0, data=TEXT, resume=False)
    cases = [
        {"name": "lora", "mode": "finetune", "config": config(tmp_path / "lora", model=TINY, finetune="lora",
                                                                init_from=str(hf), lr=1e-2, **common)},
        {"name": "qlora", "mode": "finetune", "config": config(tmp_path / "qlora", model=TINY_Q, finetune="qlora",
                                                                 lora_rank=8, init_from=str(hf_q), lr=1e-2, **common)},
        {"name": "full", "mode": "finetune", "config": config(tmp_path / "full", model=TINY, finetune="full",
                                                                init_from=str(hf), lr=1e-3, **common)},
        {"name": "full-offload", "mode": "finetune",
         "config": config(tmp_path / "off", model=TINY, finetune="full", cpu_offload=True, init_from=str(hf),
                          lr=1e-3, **common)},
    ]
    res = run_cases(2, cases, tmp_path, timeout=400)
    for name, r in res.items():
        assert "error" not in r, (name, r)
        # every loaded shard equals the file's slice (QLoRA: the file's tensor in NF4), on both ranks
        assert r["mismatched"] == [] and r["loaded"] == (21 if name != "qlora" else 21), (name, r["mismatched"])
        assert r["losses"][-1] < r["losses"][0], (name, r["losses"])
    lora = res["lora"]
    # the run starts where pre-training ended (the weights were loaded), far below an untrained model's ln 256
    assert lora["losses"][0] < 0.5 * (pre_losses[0] + pre_losses[-1]) and lora["losses"][0] < 4.5, lora["losses"]
    # only the adapters train: in the optimizer, changed by it; every frozen weight is as loaded
    assert lora["trainable"] and all(n.endswith(ADAPTERS) for n in lora["trainable"])
    assert lora["in_optimizer"] == len(lora["trainable"]) == 2 * 2 * 7  # 2 layers x 7 linears x (A, B)
    assert set(lora["changed"]) <= set(lora["trainable"]) and any(n.endswith("lora_b.weight") for n in lora["changed"])
    frozen = [n for n in lora["unchanged"] if not n.endswith(ADAPTERS)]
    assert len(frozen) == 21  # embedding, output, final norm, and per layer 2 norms + 7 linears
    q = res["qlora"]
    assert all(n.endswith(ADAPTERS) for n in q["changed"]) and q["in_optimizer"] == 28
    # CPU offload moves state, not numbers: the same losses as on the "GPU" (here: the same CPU tensors)
    assert res["full-offload"]["losses"] == pytest.approx(res["full"]["losses"], rel=1e-6, abs=1e-6)
    assert res["full"]["in_optimizer"] == 21 and len(res["full"]["changed"]) == 21


def test_user_path_plan_launch_export(pretrained, tmp_path):
    """meshplan estimate -o (LoRA plan of the checkpoint's config.json) -> meshplan launch --init-from ->
    meshplan export-weights (PEFT adapters, and merged weights equal to base + alpha/r B A)."""
    hf, _ = pretrained["tiny"]
    plan = tmp_path / "lora.yaml"
    est = meshplan("estimate", "--model", str(hf / "config.json"), "--gpus", "2", "--gpus-per-node", "2",
                   "--seq-len", "32", "--global-batch-size", "8", "--micro-batch-size", "2", "--finetune", "lora",
                   "--lora-rank", "8", "--lora-alpha", "16", "--lora-targets", "q_proj,v_proj,mlp", "-o", str(plan))
    assert est.returncode == 0, est.stderr
    run = tmp_path / "run"
    launch = meshplan("launch", str(plan), "--backend", "local", "--device", "cpu", "--steps", "4", "--run-dir",
                      str(run), "--init-from", str(hf))
    assert launch.returncode == 0, launch.stderr[-3000:]
    assert f"loaded {hf}" in launch.stdout + launch.stderr
    saved = json.loads((run / "config.json").read_text())
    assert saved["finetune"] == "lora" and saved["init_from"] == str(hf.resolve())
    adapters, merged = tmp_path / "adapters", tmp_path / "merged"
    assert meshplan("export-weights", str(run), "-o", str(adapters)).returncode == 0
    assert meshplan("export-weights", str(run), "-o", str(merged), "--merge", "--dtype", "float32").returncode == 0
    cfg = json.loads((adapters / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 8 and cfg["lora_alpha"] == 16
    assert sorted(cfg["target_modules"]) == ["down_proj", "gate_proj", "q_proj", "up_proj", "v_proj"]
    ad = load_file(str(adapters / "adapter_model.safetensors"))
    assert len(ad) == 2 * 5 * 2
    base, full = load_file(str(hf / "model.safetensors")), load_file(str(merged / "model.safetensors"))
    key = "model.layers.1.self_attn.q_proj.weight"
    a = ad["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"]
    b = ad["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"]
    assert b.abs().sum() > 0  # trained
    expect = base[key].float() + 16 / 8 * (b.float() @ a.float())
    assert torch.allclose(full[key], expect, atol=1e-2)  # adapters were exported in bf16
    untargeted = "model.layers.1.self_attn.k_proj.weight"
    assert torch.equal(full[untargeted], base[untargeted])


def test_truncated_checkpoint_is_one_line_and_exits_nonzero(pretrained, tmp_path):
    hf, _ = pretrained["tiny"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((hf / "config.json").read_text())
    data = (hf / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    cfg = config(tmp_path / "run", model=TINY, dp_shard=2, steps=2, finetune="lora", init_from=str(broken))
    proc = train(2, cfg, tmp_path / "cfg.json", timeout=200)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.safetensors" in errors[0] and "truncated" in errors[0], proc.stderr[-2000:]
    # no worker traceback (torchrun's agent reports the failed worker in its own words after the line)
    assert "hf_weights.py" not in proc.stderr and "hf_export.py" not in proc.stderr and "HFWeightsError" not in proc.stderr
    # the launcher refuses a folder without config.json before starting anything
    plan_dir = tmp_path / "plan"
    plan_dir.mkdir()
    plan = plan_dir / "p.yaml"
    assert meshplan("estimate", "--model", str(hf / "config.json"), "--gpus", "2", "--gpus-per-node", "2",
                    "--seq-len", "32", "--finetune", "lora", "-o", str(plan)).returncode == 0
    out = meshplan("launch", str(plan), "--backend", "local", "--device", "cpu", "--init-from", str(tmp_path),
                   "--dry-run")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "config.json" in out.stderr, out.stderr
