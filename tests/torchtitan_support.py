"""What the real-torchtitan tests share: the plans they export, the releases they run (each in its own folder,
through tests/torchtitan_probe.py) and the field-by-field comparison of what a release built with the plan
(tests/test_torchtitan_real.py, tests/test_torchtitan_030.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.estimator.config import TrainConfig
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import load_model
from meshplan.estimator.physics.stages import stage_blocks, stage_share
from meshplan.planner.export import render
from meshplan.planner.export.torchtitan_03 import titan_lora_params
from meshplan.planner.plan_file import LRSchedule, Optimizer, Plan, make_plan

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ROOT / ".engines"
HF_QWEN3_30B = ROOT / "tests" / "fixtures" / "hf" / "Qwen3-30B-A3B" / "config.json"  # its architecture keys
PROBE = Path(__file__).with_name("torchtitan_probe.py")
INSTALL = ".ci/install-torchtitan.sh .venv/bin/python"
MARK = "MESHPLAN_PROBE_JSON "
CC = {"h100-sxm": [9, 0], "b200": [10, 0]}  # compute capability of the plans' GPUs (Float8 gates)
IN_CI = os.environ.get("CI") == "true"


# --------------------------------------------------------------------------------------------- the plans
def plan(model: str, gpus: int, decay: str = "cosine", hw: str = "h100-sxm", init_from: str | None = None,
         **kw) -> Plan:
    """A plan whose every training value differs from torchtitan's defaults and from the llama3 config
    functions' (lr 3e-4 / 1.5e-4 / 8e-5, seq 8192, 1000 steps, ...), so a dropped value cannot pass unseen."""
    cfg = TrainConfig(gpus=gpus, gpus_per_node=8, dp_shard=-1, **kw)
    p = make_plan(load_model(model), model, load_hardware(hw), cfg, steps=311, init_from=init_from)
    training = p.training.model_copy(update={
        "grad_clip": 0.61, "seed": 4242, "checkpoint_interval": 123,
        "optimizer": Optimizer(lr=1.7e-4, betas=(0.87, 0.97), eps=3e-9, weight_decay=0.033),
        "lr_schedule": LRSchedule(warmup_steps=37, decay=decay, min_lr_ratio=0.07),
    })
    return Plan.model_validate({**p.model_dump(), "training": training.model_dump()})


def cases(float8_tensorwise: bool) -> dict[str, Plan]:
    """The plans every release is checked with; 0.3.0 has no tensorwise Float8, so it gets rowwise there."""
    f8 = "tensorwise" if float8_tensorwise else "rowwise"
    return {
        "8b-fsdp-accum": plan("llama3-8b", 16, global_batch_size=64, micro_batch_size=2, seq_len=4096, compile=True),
        "70b-fsdp-tp-float8-compile-asynctp": plan(
            "llama3-70b", 64, decay="linear", tp=4, global_batch_size=64, seq_len=4096, float8=f8, compile=True,
            async_tp=True),
        "405b-pp-interleaved": plan(
            "llama3-405b", 512, tp=8, pp=8, pp_schedule="Interleaved1F1B", global_batch_size=512, seq_len=4096,
            ac="full", compile=True, float8=f8, async_tp=True),
        "405b-pp-interleaved-vpp4": plan(
            "llama3-405b", 512, decay="constant", tp=8, pp=8, pp_schedule="Interleaved1F1B", vpp=4,
            micro_batch_size=2, global_batch_size=1024, seq_len=4096, ac="full"),
        "8b-hsdp-cp": plan("llama3-8b", 32, decay="constant", dp_replicate=2, cp=2, global_batch_size=32,
                           seq_len=8192, ac="none", fsdp_reshard_after_forward="never"),
        "70b-pp-1f1b": plan("llama3-70b", 64, decay="linear", tp=8, pp=2, pp_schedule="1F1B", global_batch_size=64,
                            seq_len=4096, ac="full", fsdp_reshard_after_forward="always"),
        # ZB1P: a looped schedule (2 stages per rank by default), eager blocks (torch refuses compiled ones)
        "70b-pp-zero-bubble": plan("llama3-70b", 64, tp=8, pp=2, pp_schedule="InterleavedZeroBubble",
                                   global_batch_size=64, seq_len=4096, ac="full"),
        # torchtitan's split with both weights 0 (the planner's even split): 80 blocks, 10 on each of 8 stages
        "70b-pp8-even-split": plan("llama3-70b", 128, tp=8, pp=8, pp_schedule="1F1B", global_batch_size=64,
                                   seq_len=4096, ac="full", pp_first_stage_less_layers=0, pp_last_stage_less_layers=0),
        "8b-mxfp8-b200": plan("llama3-8b", 8, hw="b200", global_batch_size=16, seq_len=4096, float8="mxfp8",
                              compile=True),
        # mixture of experts: torchtitan's own flavors, expert parallelism carved from dp_shard x cp x tp
        "dsv3-16b-ep8-float8": plan("deepseek-v3-16b", 8, global_batch_size=32, micro_batch_size=2, seq_len=4096,
                                    ep=8, float8=f8, compile=True),
        "qwen3-30b-ep8-full-ac": plan("qwen3-30b-a3b", 16, decay="linear", global_batch_size=32, seq_len=4096,
                                      ep=8, ac="full"),
        # the same model planned from its Hugging Face config.json (not the preset's name): torchtitan's flavor by
        # its shapes
        "qwen3-30b-from-config-json": plan(str(HF_QWEN3_30B), 16, global_batch_size=32, seq_len=4096, ep=8,
                                           ac="full"),
        # a dense model whose attention is wider than its stream (64 heads of 128 over 5120, QK-norm)
        "qwen3-32b-fsdp-tp4": plan("qwen3-32b", 32, tp=4, global_batch_size=32, seq_len=4096, ac="full"),
        # training dtype bfloat16 (bf16 parameters, gradients and AdamW state), TP without FSDP as the planner ranks it
        "8b-tp8-bf16": plan("llama3-8b", 8, tp=8, global_batch_size=16, seq_len=4096, ac="full", dtype="bfloat16"),
    }


MOE_022 = {  # 0.2.2 only: Llama 4 left torchtitan before 0.3.0
    "llama4-scout-tp8-ep2": plan("llama4-scout", 32, tp=8, ep=2, global_batch_size=32, seq_len=4096, ac="full"),
}
MOE_030 = {  # 0.3.0 only: Qwen3 235B-A22B (no config function: 30B-A3B's with the flavor swapped), with PP
    "qwen3-235b-pp4-ep8": plan("qwen3-235b-a22b", 128, pp=4, ep=8, global_batch_size=256, seq_len=4096, ac="full"),
}
# fine-tuning from a Hugging Face checkpoint (torchtitan reads the folder only when training starts)
INIT = "/checkpoints/Llama-3.1-70B"
FT_022 = {  # 0.2.2 has no LoRA: full fine-tuning with FSDP2 CPU offload
    "70b-full-offload": plan("llama3-70b", 16, finetune="full", cpu_offload=True, init_from=INIT,
                             global_batch_size=32, seq_len=4096, ac="full"),
}
FT_030 = {  # 0.3.0's LoRAConverter: every linear (q, k, v fused into wqkv) or the MLP only, with and without offload
    "70b-lora-r16": plan("llama3-70b", 16, finetune="lora", lora_rank=16, lora_alpha=32, init_from=INIT,
                         global_batch_size=32, seq_len=4096, ac="full"),
    "8b-lora-mlp-offload": plan("llama3-8b", 8, decay="linear", finetune="lora", lora_rank=8, lora_alpha=8,
                                lora_targets=("w1", "w2", "w3"), cpu_offload=True, init_from="/ckpt/llama3-8b",
                                global_batch_size=16, seq_len=4096, ac="selective"),
} | FT_022
# 0.3.0 only: dp_replicate beside TP without FSDP, which it wraps in FSDP2 with one shard (0.2.2's DDP refuses it)
LAYOUT_030 = {"8b-replicate2-tp8": plan("llama3-8b", 16, dp_replicate=2, tp=8, global_batch_size=16, seq_len=4096,
                                        ac="full")}
CASES_022 = cases(float8_tensorwise=True) | MOE_022 | FT_022
CASES_030 = cases(float8_tensorwise=False) | MOE_030 | FT_030 | LAYOUT_030
# What 0.3.0's command line can express: the config function's built-in Float8 must be the plan's.
CLI_CASES = ["8b-fsdp-accum", "405b-pp-interleaved", "8b-hsdp-cp", "70b-pp-1f1b", "70b-pp8-even-split",
             "qwen3-30b-ep8-full-ac", "70b-full-offload", "8b-tp8-bf16"]
CLI_REFUSED = ["70b-fsdp-tp-float8-compile-asynctp", "405b-pp-interleaved-vpp4", "8b-mxfp8-b200"]


# --------------------------------------------------------------------------------------------- the releases
def engine(version: str) -> str:
    """PYTHONPATH for one release (its folder, then triton); fail in CI, skip elsewhere, when it is missing."""
    folder, triton = ENGINES / f"torchtitan-{version}", ENGINES / "triton"
    ok = all((d / ".meshplan-stamp").exists() for d in (folder, triton))
    ok = ok and any(folder.glob(f"torchtitan-{version}.dist-info"))
    if not ok:
        msg = f"torchtitan {version} is not installed in {folder}; install it with: {INSTALL}"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return f"{folder}{os.pathsep}{triton}"


def probe(version: str, requests: dict, timeout: float = 600) -> dict:
    """Every request answered by one probe process under the release (tests/torchtitan_probe.py): {name: result}.
    A request may name folders for sys.path ("path") and a working directory ("cwd")."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env |= {"PYTHONPATH": engine(version), "PYTHONNOUSERSITE": "1", "PYTHONWARNINGS": "ignore", "COLUMNS": "100"}
    reqs = {name: {**r, **({"path": [str(p) for p in r["path"]]} if "path" in r else {}),
                   **({"cwd": str(r["cwd"])} if "cwd" in r else {})} for name, r in requests.items()}
    out = subprocess.run([sys.executable, str(PROBE)], input=json.dumps(reqs), capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith(MARK)]
    assert out.returncode == 0 and lines, f"probe under torchtitan {version} failed:\n{out.stderr[-4000:]}"
    results = json.loads(lines[-1][len(MARK):])
    assert set(results) == set(requests), sorted(set(requests) ^ set(results))
    for name, r in results.items():
        assert r["version"] == version, (name, r["version"])
        assert r["where"].startswith(str(ENGINES / f"torchtitan-{version}")), r["where"]
    return results


def entry_ok(r: dict) -> None:
    """`python -m torchtitan.train ... --comm.mode local_tensor` ran 0.3.0's main() up to where training would
    start."""
    assert r["rc"] == 0, r["output"][-4000:]
    assert "Local tensor mode enabled - skipping training execution" in r["output"], r["output"][-4000:]


# --------------------------------------------------------------------------------------------- comparisons
def expected(p: Plan, output_name: str) -> dict:
    """What the plan says, in the terms of the comparison (nothing here comes from an export)."""
    par, t, o, s = p.parallel, p.training, p.training.optimizer, p.training.lr_schedule
    dp = par.dp_replicate * par.dp_shard
    out = {
        "dp_replicate": par.dp_replicate, "dp_shard": par.dp_shard, "cp": par.cp, "tp": par.tp, "pp": par.pp,
        "world_size": p.cluster.gpus,
        "sequences per forward per DP rank": par.micro_batch_size,
        "microbatches per step per DP rank": t.global_batch_size // (dp * par.micro_batch_size),
        "local_batch_size": t.global_batch_size // dp if par.pp > 1 else par.micro_batch_size,
        "global_batch_size": t.global_batch_size, "seq_len": t.seq_len, "steps": t.steps, "grad clip": t.grad_clip,
        "AC": par.ac, "compile": par.compile, "async TP": par.async_tp,
        "fsdp reshard after forward": par.fsdp_reshard_after_forward,
        "float8": par.float8, "bf16 outside blocks": sorted([output_name]) if par.float8 != "none" else [],
        "optimizer": "AdamW", "lr": o.lr, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay,
        "warmup_steps": s.warmup_steps, "decay": s.decay, "min lr ratio": s.min_lr_ratio if s.decay != "constant" else None,
        "lr factor at end of warmup": 1.0, "lr factor at last step": s.min_lr_ratio if s.decay != "constant" else 1.0,
        "lr lowest at the last step": True, "lr never below min lr ratio": True,  # after warmup
        "checkpoint": True, "checkpoint interval": t.checkpoint_interval, "seed": t.seed,
        "layers": p.model.layers, "hidden": p.model.hidden, "heads": p.model.heads, "kv_heads": p.model.kv_heads,
        "vocab": p.model.vocab, "ffn_hidden": p.model.ffn_hidden if p.model.dense_layers else None,
        "params": p.model.params,
        # torchtitan's training.dtype, and the dtype its Trainer builds the model's parameters in
        "training dtype": t.dtype, "parameter dtypes": [f"torch.{t.dtype}"],
    }
    m = p.model.moe
    if m is not None:  # torchtitan keeps the routing bias (DeepSeek-V3's e_score_correction_bias) as a buffer
        out["params"] -= p.model.moe_layers * m.experts if m.router_bias else 0
        out |= {"ep": par.ep, "experts": m.experts, "top_k": m.top_k, "moe layers": p.model.moe_layers}
    if par.pp > 1:  # the blocks of each stage as the estimate has them (estimator/physics/stages.py)
        out |= {"pp_schedule": par.pp_schedule, "stages per PP rank": par.vpp,
                "blocks per stage": stage_blocks(p.model.layers, par.pp * par.vpp, par.pp_first_stage_less_layers,
                                                 par.pp_last_stage_less_layers)}
    ft = p.finetune
    out |= {"cpu offload": bool(par.cpu_offload), "initial load path": ft.init_from if ft else None,
            "trainable params": out["params"]}
    if ft is not None and ft.init_from:
        out |= {"initial load model only": True, "initial load in HF": True}
    if ft is not None and ft.mode == "lora":  # q, k, v adapted together as wqkv (the export refuses them apart)
        modules = (1 if "q" in ft.lora_targets else 0) + sum(t in ft.lora_targets for t in ("o", "w1", "w2", "w3"))
        out |= {"trainable params": titan_lora_params(p), "params": out["params"] + titan_lora_params(p),
                "LoRA linears": p.model.layers * modules,
                "LoRA (rank, alpha / rank)": [[ft.lora_rank, ft.lora_alpha / ft.lora_rank]]}
    return out


def _finetune(c: dict, r: dict) -> dict:
    """What the release made of a plan's fine-tuning: offload, the initial load and (0.3.0) the LoRA linears."""
    ck = c["checkpoint"]
    out = {"cpu offload": c["training"]["enable_cpu_offload"], "initial load path": ck["initial_load_path"],
           "trainable params": r["model"]["trainable"]}
    if ck["initial_load_path"]:
        out |= {"initial load model only": ck["initial_load_model_only"], "initial load in HF": ck["initial_load_in_hf"]}
    lora = r["linears"].get("LoRALinear")
    if lora:
        out |= {"LoRA linears": lora["count"], "LoRA (rank, alpha / rank)": [list(x) for x in lora["lora"]]}
    return out


FLOAT8_KIND = {"ScalingGranularity.TENSORWISE": "tensorwise", "ScalingGranularity.AXISWISE": "rowwise"}


def built_float8(r: dict) -> tuple[str, list[str]]:
    """The Float8 recipe the release's model ended up with, from its converted Linear layers."""
    lin = r["linears"]
    bf16_outside = sorted(lin.get("Linear", {}).get("not_in_layers", []))
    quant = {k: v for k, v in lin.items() if k not in ("Linear", "LoRALinear")}
    if not quant:
        return "none", []
    (cls, info), = quant.items()
    assert not info["not_in_layers"], f"{cls} outside the blocks: {info['not_in_layers']}"
    if cls.startswith("MX"):
        return "mxfp8", bf16_outside
    kinds = {FLOAT8_KIND.get(s, s) for s in info["scaling"]}
    assert len(kinds) == 1, kinds
    return kinds.pop(), bf16_outside


def _lr(r: dict, warmup: int, min_ratio: float) -> dict:
    """The release's LR schedule, stepped through the run: factors of the base lr."""
    f = r["lr_factors"]
    return {"lr factor at end of warmup": f[warmup - 1] if warmup else f[0], "lr factor at last step": f[-1],
            "lr lowest at the last step": min(f[warmup:]) == f[-1], "lr never below min lr ratio": min(f[warmup:]) >= min_ratio}


def _actual(r: dict, ac: str, async_tp: bool) -> dict:
    """What a release built, in the comparison's terms; the releases differ in where AC and async TP are read."""
    c = r["config"]
    tr, par, ls = c["training"], c["parallelism"], c["lr_scheduler"]
    dp = r["dims"]["dp_replicate"] * r["dims"]["dp_shard"]
    pp = r["dims"]["pp"]
    accum = tr["global_batch_size"] // (tr["local_batch_size"] * dp)  # the Trainer's arithmetic (both releases)
    fwd = par["pipeline_parallel_microbatch_size"] if pp > 1 else tr["local_batch_size"]
    f8, bf16 = built_float8(r)
    out = {
        **r["dims"],
        "sequences per forward per DP rank": fwd,
        "microbatches per step per DP rank": accum * (tr["local_batch_size"] // fwd),
        "local_batch_size": tr["local_batch_size"], "global_batch_size": tr["global_batch_size"],
        "seq_len": tr["seq_len"], "steps": tr["steps"], "grad clip": tr["max_norm"],
        "AC": ac, "compile": c["compile"]["enable"] and "model" in c["compile"]["components"],
        "async TP": async_tp, "fsdp reshard after forward": par["fsdp_reshard_after_forward"],
        "float8": f8, "bf16 outside blocks": bf16,
        "optimizer": r["optimizer"]["class"], **{k: r["optimizer"][k] for k in ("lr", "betas", "eps", "weight_decay")},
        "warmup_steps": ls["warmup_steps"],
        "decay": "constant" if ls["decay_ratio"] == 0 else ls["decay_type"],
        "min lr ratio": None if ls["decay_ratio"] == 0 else ls["min_lr_factor"],
        **_lr(r, ls["warmup_steps"], ls["min_lr_factor"]),
        "checkpoint": c["checkpoint"]["enable"], "checkpoint interval": c["checkpoint"]["interval"],
        "seed": c["debug"]["seed"],
        **_model(r),
        **_finetune(c, r),
    }
    if pp > 1:
        out |= {"pp_schedule": par["pipeline_parallel_schedule"], "stages per PP rank": r["pipeline"]["per_rank"],
                "blocks per stage": r["pipeline"]["blocks"]}
    return out


def actual_022(r: dict) -> dict:
    c = r["config"]
    ac = c["activation_checkpoint"]
    if ac["mode"] == "selective":
        assert ac["selective_ac_option"] == "op"  # op-level SAC, as the estimate assumes
    return _actual(r, ac["mode"], c["parallelism"]["enable_async_tensor_parallel"])


def actual_030(r: dict) -> dict:
    c = r["config"]
    if r["dims"]["pp"] > 1:
        assert c["training"]["disable_cuda_graphs"] is True
    ac = {"SelectiveAC.Config": "selective", "FullAC.Config": "full", None: "none"}[r["ac"]]
    return _actual(r, ac, c["compile"]["enable_async_tensor_parallel"])


def _model(r: dict) -> dict:
    m = r["model"]
    out = {"layers": m["layers"], "hidden": m["dim"], "heads": m["heads"], "kv_heads": m["kv_heads"],
           "vocab": m["vocab"], "ffn_hidden": m["ffn_hidden"], "params": m["params"],
           "training dtype": r["config"]["training"]["dtype"], "parameter dtypes": m["param_dtypes"]}
    moe = m.get("moe")
    if moe:
        out |= {"ep": r["dims"]["ep"], "experts": moe["experts"], "top_k": moe["top_k"],
                "moe layers": moe["moe_layers"]}
        if "etp" in r["dims"]:
            assert r["dims"]["etp"] == 1  # experts whole on each EP rank, as 0.3.0 (and the estimate) has them
    return out


def tolerances(p: Plan) -> dict[str, float]:
    """Absolute tolerances: torchtitan's schedule ends one decay step short of the floor (a virtual last step
    keeps the last lr above min), so the last step's factor may sit up to one decay step above min_lr_ratio."""
    s = p.training.lr_schedule
    return {"lr factor at end of warmup": 1e-9,
            "lr factor at last step": (1 - s.min_lr_ratio) / max(1, p.training.steps - s.warmup_steps) + 1e-3}


def compare(release: str, case: str, want: dict, got: dict, tol: dict[str, float] | None = None) -> None:
    """Assert every field equal (floats to 1e-12 relative, or `tol[key]` absolute), listing all mismatches; log
    the table on request."""
    rows, bad, tol = [], [], tol or {}
    for key, w in want.items():
        g = got.get(key, "<missing>")
        same = (math.isclose(g, w, rel_tol=1e-12, abs_tol=tol.get(key, 0.0))
                if isinstance(w, float) and isinstance(g, int | float) else g == w)
        rows.append(f"| {release} | {case} | {key} | {w!r} | {g!r} | {'ok' if same else 'MISMATCH'} |")
        if not same:
            bad.append(f"{key}: plan {w!r}, torchtitan {release} {g!r}")
    report = os.environ.get("MESHPLAN_TT_REPORT")
    if report:
        with open(report, "a") as fh:
            fh.write("\n".join(rows) + "\n")
    assert not bad, f"torchtitan {release} read {case} differently:\n" + "\n".join(bad)


# the release's own pipeline stage split over layer counts, stage counts and both weights
SPLIT_GRID = [(layers, stages, first, last) for layers in (4, 5, 26, 61, 80, 126) for stages in (2, 3, 4, 5, 8, 16)
              for first in (0, 1, 2) for last in (0, 1, 3)]
SPLIT = {"kind": "split", "grid": SPLIT_GRID}


def run_cli_script(p: Plan, tmp_path: Path, env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the real `torchtitan-cli` script with a `torchrun` that records its argv (NUL-separated)."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "torchrun").write_text('#!/bin/sh\nprintf \'%s\\0\' "$@" > "$RECORD"\n')
    (stub / "torchrun").chmod(0o755)
    script = tmp_path / "launch.sh"
    script.write_text(render(p, "torchtitan-cli", "plan.yaml"))
    script.chmod(0o755)
    record = tmp_path / "torchrun.argv"
    base = {"PATH": f"{stub}:/usr/bin:/bin", "RECORD": str(record), "MESHPLAN_RDZV_HOST": "10.0.0.7",
            "HOME": str(tmp_path)}
    out = subprocess.run([str(script)], capture_output=True, text=True, env={**base, **(env or {})}, cwd=tmp_path,
                         timeout=30)
    return out, record


def check_split(r: dict) -> None:
    """The blocks the estimate puts on each stage (estimator/physics/stages.py) are those a release's own split
    function gave (`r`: its probe result for SPLIT), over layer counts, stage counts and both weights; and the
    weights the release refuses are those above a stage's share (or a share of 0), as rule 31 has them."""
    assert "error" not in r, r.get("error")
    for (layers, stages, first, last), theirs in zip(SPLIT_GRID, r["blocks"], strict=True):
        share = stage_share(layers, stages, first, last)
        refused = share == 0 or first > share or last > share
        assert (theirs is None) == refused, (layers, stages, first, last, theirs)
        if theirs is not None:
            assert stage_blocks(layers, stages, first, last) == theirs, (layers, stages, first, last)
