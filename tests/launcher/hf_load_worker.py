"""Load a Hugging Face checkpoint into the training core's sharded model, on every rank of a real launch.

    torchrun --standalone --nproc-per-node N tests/launcher/hf_load_worker.py CASES.json OUT_DIR
    python tests/launcher/hf_load_worker.py CASES.json OUT_DIR          (one process, world 1)

CASES.json: a list of {"name", "config" (a RunConfig mapping), "checkpoint" (an HF directory)}. For each case
every rank builds its model parts (`build_model_parts(..., init_weights=False)`), loads the checkpoint with
`hf_weights.load_into` and writes OUT_DIR/NAME-rankR.pt: {core name: (global offset, local tensor)} and the
load's stats. A MeshplanError is printed as one line `error: ...` and the process exits 2, as the CLI does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from meshplan.estimator.errors import MeshplanError  # noqa: E402
from meshplan.launcher.core import hf_weights  # noqa: E402
from meshplan.launcher.core.config import RunConfig  # noqa: E402
from meshplan.launcher.core.model import clean_fqn  # noqa: E402
from meshplan.launcher.core.parallelize import build_model_parts, build_parallel  # noqa: E402
from meshplan.launcher.core.train import init_distributed  # noqa: E402


def load_case(case: dict, device: torch.device, out_dir: Path) -> None:
    """Build this rank's parts of the case's model, load the checkpoint, save the local boxes."""
    from torch.distributed.tensor import DTensor

    cfg = RunConfig.from_dict(case["config"])
    par = build_parallel(cfg, device)
    parts, _, _ = build_model_parts(cfg, par, init_weights=False)
    with hf_weights.HFCheckpoint(case["checkpoint"]) as ckpt:
        stats = hf_weights.load_into(parts, ckpt, cfg.model)
    boxes = {}
    for part in parts:
        for name, param in part.named_parameters():
            offset, _ = hf_weights.local_box(param)
            local = param.to_local() if isinstance(param, DTensor) else param
            boxes[clean_fqn(name)] = (offset, local.detach().cpu().clone())
    torch.save({"boxes": boxes, "params": stats.params, "bytes_read": stats.bytes_read,
                "unused": list(stats.unused_keys)}, out_dir / f"{case['name']}-rank{dist.get_rank()}.pt")


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(sys.argv[2])
    device = init_distributed(RunConfig.from_dict(cases[0]["config"]))
    try:
        for case in cases:
            load_case(case, device, out_dir)
            dist.barrier()
    except MeshplanError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
