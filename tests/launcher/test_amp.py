"""Which precision the core trains in without FSDP, as torchtitan's maybe_enable_amp: one device (or replicas only)
in training dtype float32 runs under torch.autocast to bf16 on the GPU, as the estimator assumes (before, the core
ran such a plan in fp32: no FSDP, so no MixedPrecisionPolicy; the H100 runs of data/measurements/ ran with the
autocast). On CPU the GPU policy is what the memory trace asks for (mixed_precision=True); a real CPU run stays fp32.
One process, world 1, gloo."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from launchtools import ROOT, TINY_MODEL, child_env

WORKER = """
import json, os, sys, torch
import torch.distributed as dist
from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.core.lora import is_nf4
from meshplan.launcher.core.train import Trainer

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo")
model = json.loads(sys.argv[2])
out = {}
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
dist.destroy_process_group()
print(json.dumps(out))
"""


def _run(worker: str) -> dict:
    """Run a worker script as one process (world 1 on a free port); its last stdout line as JSON."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-c", worker, str(port), json.dumps(TINY_MODEL)], cwd=ROOT,
                       env=child_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_autocast_where_torchtitan_uses_it():
    out = _run(WORKER)
    gpu = out["gpu_policy_fp32"]
    assert gpu == {**gpu, "autocast": True, "logits": "torch.bfloat16", "param": "torch.float32"}
    assert out["gpu_policy_bf16"]["autocast"] is False and out["gpu_policy_bf16"]["param"] == "torch.bfloat16"
    cpu = out["cpu_run_fp32"]
    assert cpu["autocast"] is False and cpu["logits"] == "torch.float32"
    assert abs(gpu["loss"] - cpu["loss"]) < 0.05  # the same model and batch, bf16 matmuls vs fp32
    assert out["is_nf4_plain"] is False


LOSS_WORKER = """
import json, os, sys, torch
import torch.distributed as dist
from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.core.model import cross_entropy
from meshplan.launcher.core.train import Trainer

os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo")
out = {}
for compile in (False, True):
    cfg = RunConfig.from_dict({"model": json.loads(sys.argv[2]), "seq_len": 16, "global_batch_size": 2,
                               "micro_batch_size": 1, "compile": compile})
    tr = Trainer(cfg, torch.device("cpu"))
    out[str(compile)] = {"eager_loss": tr.loss_fn is cross_entropy,
                         "compiled": getattr(tr.loss_fn, "_torchdynamo_orig_callable", None) is cross_entropy,
                         "loss": tr.train_step()["loss"]}
dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_compile_compiles_the_loss_as_torchtitan_does():
    """compile: true compiles the loss too (torchtitan's build_cross_entropy_loss), so the fp32 logits are fused away
    as the estimator's compiled_loss_bytes_per_element assumes; on one H100 the core without it held 7-8 GiB more
    than estimated at 8k tokens x 128k vocabulary. Same loss either way."""
    out = _run(LOSS_WORKER)
    assert out["False"]["eager_loss"] and not out["False"]["compiled"]
    assert out["True"]["compiled"] and not out["True"]["eager_loss"]
    assert abs(out["True"]["loss"] - out["False"]["loss"]) < 1e-3
