"""Run several training configurations in one torchrun launch (saves process start-up time in tests).

    torchrun --standalone --nproc-per-node N tests/launcher/cases_worker.py CASES.json OUT.json

CASES.json: a list of {"name", "config" (a full RunConfig mapping), "mode": "losses" | "grads"}. Every case is
run through the real training core (`launcher.core.train`); rank 0 writes {name: result} to OUT.json, where a
result is the per-step losses, or for "grads" the loss and the full (unsharded) gradient norms and checksums
after one forward/backward, or {"error": message}.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from meshplan.launcher.core.config import RunConfig  # noqa: E402
from meshplan.launcher.core.model import clean_fqn  # noqa: E402
from meshplan.launcher.core.train import Trainer, init_distributed, run  # noqa: E402


def grads_case(cfg: RunConfig, device: torch.device) -> dict:
    """Loss and per-parameter full gradients after one forward/backward (no optimizer step)."""
    from torch.distributed.tensor import DTensor

    trainer = Trainer(cfg, device)
    inputs, labels = trainer.next_batch()
    loss = trainer.global_loss(trainer.forward_backward(inputs, labels))
    grads = {}
    for part in trainer.parts:
        for name, p in part.named_parameters():
            g = p.grad
            if g is None:
                grads[clean_fqn(name)] = None
                continue
            g = g.full_tensor() if isinstance(g, DTensor) else g
            grads[clean_fqn(name)] = g.detach().float().cpu().flatten().tolist()
    return {"loss": loss, "grads": grads}


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    out: dict[str, dict] = {}
    first = RunConfig.from_dict(cases[0]["config"])
    device = init_distributed(first)
    rank = dist.get_rank()
    for case in cases:
        try:
            cfg = RunConfig.from_dict(case["config"])
            if case.get("mode") == "grads":
                out[case["name"]] = grads_case(cfg, device)
            else:
                recs = run(cfg, device, log=False)
                out[case["name"]] = {"losses": [r["loss"] for r in recs]}
        except Exception as exc:  # one failing case must not hide the others
            traceback.print_exc()
            out[case["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
        dist.barrier()
    if rank == 0:
        Path(sys.argv[2]).write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
