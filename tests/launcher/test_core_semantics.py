"""Where the core must do what torchtitan does for a plan to run as planned, one process (world 1, gloo): which
precision it trains in without FSDP (torchtitan's maybe_enable_amp: one device in training dtype float32 runs under
torch.autocast to bf16 on the GPU, as the estimator assumes; before, the core ran such a plan in fp32: no FSDP, so
no MixedPrecisionPolicy; the H100 runs of data/measurements/ ran with the autocast), and that compile compiles the
loss. On CPU the GPU policy is what the memory trace asks for (mixed_precision=True); a real CPU run stays fp32.
Also the one-rank FSDP2 probe benchmarks/measure_gpu.py uses."""

from __future__ import annotations

import json

import pytest
from launchtools import TINY_MODEL, run_world1

# each worker: PREAMBLE (a gloo group of one on the port in argv[1]; the model in argv[2]), then its body, which
# fills `out`, then EPILOGUE: the group destroyed, `out` printed as the last line, and the process ended as the core's
# ranks end (os._exit once everything is flushed: interpreter teardown can abort in torch's C++ threads, "terminate
# called without an active exception", seen once in CI). A body that raises never reaches it and exits non-zero.
PREAMBLE = """
import json, os, sys, torch
import torch.distributed as dist
from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.core.train import Trainer

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo")
model = json.loads(sys.argv[2])
out = {}
"""
EPILOGUE = """
dist.destroy_process_group()
print(json.dumps(out), flush=True)
sys.stderr.flush()
os._exit(0)
"""

WORKER = PREAMBLE + """
from meshplan.launcher.core.lora import is_nf4

for name, dtype, mixed in (("gpu_policy_fp32", "float32", True), ("gpu_policy_bf16", "bfloat16", True),
                           ("cpu_run_fp32", "float32", None)):
    cfg = RunConfig.from_dict({"model": model, "seq_len": 16, "global_batch_size": 2, "micro_batch_size": 1,
                               "dtype": dtype})
    tr = Trainer(cfg, torch.device("cpu"), mixed_precision=mixed)
    inputs, labels = tr.next_batch()
    with tr._amp_context():
        logits = tr.parts[0](inputs[:1])
    step = tr.train_step()
    out[name] = {"autocast": isinstance(tr._amp_context(), torch.autocast), "logits": str(logits.dtype),
                 "param": str(next(tr.parts[0].parameters()).dtype), "loss": step["loss"]}
out["is_nf4_plain"] = is_nf4(torch.zeros(2))
""" + EPILOGUE


def test_autocast_where_torchtitan_uses_it():
    out = run_world1(WORKER, json.dumps(TINY_MODEL))
    gpu = out["gpu_policy_fp32"]
    assert gpu == {**gpu, "autocast": True, "logits": "torch.bfloat16", "param": "torch.float32"}
    assert out["gpu_policy_bf16"]["autocast"] is False and out["gpu_policy_bf16"]["param"] == "torch.bfloat16"
    cpu = out["cpu_run_fp32"]
    assert cpu["autocast"] is False and cpu["logits"] == "torch.float32"
    assert abs(gpu["loss"] - cpu["loss"]) < 0.05  # the same model and batch, bf16 matmuls vs fp32
    assert out["is_nf4_plain"] is False


LOSS_WORKER = PREAMBLE + """
from meshplan.launcher.core.model import cross_entropy

for name, compile, components in (("off", False, ["model", "loss"]), ("both", True, ["model", "loss"]),
                                  ("loss", True, ["loss"]), ("model", True, ["model"])):
    cfg = RunConfig.from_dict({"model": model, "seq_len": 16, "global_batch_size": 2,
                               "micro_batch_size": 1, "compile": compile, "compile_components": components})
    tr = Trainer(cfg, torch.device("cpu"))
    out[name] = {"eager_loss": tr.loss_fn is cross_entropy,
                 "compiled": getattr(tr.loss_fn, "_torchdynamo_orig_callable", None) is cross_entropy,
                 "blocks": [b._compiled_call_impl is not None for b in tr.parts[0].layers.values()],
                 "loss": tr.train_step()["loss"]}
""" + EPILOGUE


@pytest.mark.slow
def test_compile_compiles_the_loss_as_torchtitan_does():
    """compile: true compiles the blocks and the loss (torchtitan's compile.components model + loss;
    build_cross_entropy_loss), so the fp32 logits are fused away as the estimator's compiled_loss_bytes_per_element
    assumes; on one H100 the core without it held 7-8 GiB more than estimated at 8k tokens x 128k vocabulary.
    compile_components loss compiles the loss alone (torchtitan's deepseek_v3_16b.toml), model the blocks alone.
    Same loss every way."""
    out = run_world1(LOSS_WORKER, json.dumps(TINY_MODEL))
    assert out["off"]["eager_loss"] and not out["off"]["compiled"] and not any(out["off"]["blocks"])
    assert out["both"]["compiled"] and not out["both"]["eager_loss"] and all(out["both"]["blocks"])
    assert out["loss"]["compiled"] and not any(out["loss"]["blocks"])
    assert out["model"]["eager_loss"] and all(out["model"]["blocks"]) and out["model"]["blocks"]
    for name in ("both", "loss", "model"):
        assert abs(out[name]["loss"] - out["off"]["loss"]) < 1e-3, name


FSDP_WORKER = PREAMBLE + """
from torch.distributed.fsdp import FSDPModule

for one_rank in (False, True):
    cfg = RunConfig.from_dict({"model": model, "seq_len": 16, "global_batch_size": 2,
                               "micro_batch_size": 1, "fsdp_one_rank": one_rank})
    tr = Trainer(cfg, torch.device("cpu"), mixed_precision=True)
    out[str(one_rank)] = {"blocks": [isinstance(b, FSDPModule) for b in tr.parts[0].layers.values()],
                          "autocast": isinstance(tr._amp_context(), torch.autocast), "loss": tr.train_step()["loss"]}
""" + EPILOGUE


def test_fsdp_one_rank_wraps_every_block():
    """fsdp_one_rank (benchmarks/measure_gpu.py's probe of FSDP2's own per-block cost on one GPU) wraps every block
    in FSDP2 on a mesh of one rank; mixed precision then comes from FSDP2's policy, not autocast; same loss."""
    out = run_world1(FSDP_WORKER, json.dumps(TINY_MODEL))
    assert out["False"]["blocks"] == [False] * TINY_MODEL["layers"] and out["False"]["autocast"]
    assert out["True"]["blocks"] == [True] * TINY_MODEL["layers"] and not out["True"]["autocast"]
    assert abs(out["True"]["loss"] - out["False"]["loss"]) < 0.05
