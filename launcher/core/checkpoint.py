"""Atomic, resumable checkpoints with torch.distributed.checkpoint (DCP).

Layout under the checkpoint dir:
    step-00000004/   DCP shards of model + optimizer; train_state.json (step, data position, LR schedule)
    latest           name of the newest complete checkpoint (replaced atomically)
A save writes `step-N.tmp/` and renames it to `step-N/` only once every rank's data and the metadata are on
disk, then repoints `latest`; a run killed mid-save leaves a `.tmp` dir that is ignored (and removed on the
next start).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from launcher.core import faults

_OPTIM_OPTS = StateDictOptions(flatten_optimizer_state_dict=True)


def _model_state(parts: list[nn.Module]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        out.update(get_model_state_dict(part))
    return out


def _optim_state(parts: list[nn.Module], optimizers: list[Optimizer]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part, opt in zip(parts, optimizers, strict=True):
        out.update(get_optimizer_state_dict(part, opt, options=_OPTIM_OPTS))
    return out


class Checkpointer:
    """Saves and restores model parts, their optimizers, LR schedulers and the data position."""

    def __init__(self, root: Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = keep
        self.rank = dist.get_rank()

    def _barrier(self) -> None:
        dist.barrier()

    def clean_partial(self) -> None:
        """Remove `.tmp` dirs left by a save that was killed (rank 0; call at start-up)."""
        if self.rank == 0 and self.root.exists():
            for tmp in self.root.glob("step-*.tmp"):
                shutil.rmtree(tmp, ignore_errors=True)
        self._barrier()

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        pointer = self.root / "latest"
        if not pointer.exists():
            return None
        path = self.root / pointer.read_text().strip()
        if (path / ".metadata").exists() and (path / "train_state.json").exists():
            return path
        return None

    def save(
        self, step: int, parts: list[nn.Module], optimizers: list[Optimizer], train_state: dict[str, Any]
    ) -> Path:
        """Collective: every rank calls it. Returns the committed checkpoint dir."""
        final = self.root / f"step-{step:08d}"
        tmp = self.root / f"step-{step:08d}.tmp"
        if self.rank == 0:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        self._barrier()
        state = {"model": _model_state(parts), "optim": _optim_state(parts, optimizers)}
        dcp.save(state, checkpoint_id=str(tmp))
        self._barrier()
        faults.point("kill_in_save", step)
        if self.rank == 0:
            (tmp / "train_state.json").write_text(json.dumps({"step": step, **train_state}, indent=1))
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            pointer_tmp = self.root / "latest.tmp"
            pointer_tmp.write_text(final.name)
            os.replace(pointer_tmp, self.root / "latest")
            self._prune(final)
        self._barrier()
        return final

    def _prune(self, newest: Path) -> None:
        done = sorted(p for p in self.root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in done[: max(0, len(done) - self.keep)]:
            if old != newest:
                shutil.rmtree(old, ignore_errors=True)

    def load(self, path: Path, parts: list[nn.Module], optimizers: list[Optimizer]) -> dict[str, Any]:
        """Restore parts and optimizers in place; returns train_state (step, data, scheduler)."""
        state = {"model": _model_state(parts), "optim": _optim_state(parts, optimizers)}
        dcp.load(state, checkpoint_id=str(path))
        for part in parts:
            set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
        for part, opt in zip(parts, optimizers, strict=True):
            set_optimizer_state_dict(part, opt, optim_state_dict=state["optim"], options=_OPTIM_OPTS)
        return json.loads((path / "train_state.json").read_text())
