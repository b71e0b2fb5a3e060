"""Atomic, verified, resumable checkpoints with torch.distributed.checkpoint (DCP).

Layout under the checkpoint dir:
    step-00000004/   DCP shards of model + optimizer; train_state.json (step, data position, LR schedule,
                     the plan's fingerprint); manifest.json (size and CRC-32 of every file, written last)
    latest           name of the newest complete checkpoint (replaced atomically); a hint, never trusted alone

A save writes `step-N.tmp/`, checksums it (each rank a share of the files) and renames it to `step-N/` only once
every rank's data, the metadata and the manifest are on disk; then it repoints `latest` and prunes. A run killed
mid-save leaves a `.tmp` dir that is ignored (and removed on the next start).

Resuming takes the newest checkpoint that verifies against its manifest: a `latest` pointer that is empty,
names a missing step or points outside the folder, a step without `.metadata`, or a shard whose size or
checksum changed, is skipped with a warning (never silently restarting from step 1), and when checkpoints exist
but none verifies the run stops with an error. Retention only removes checkpoints older than the newest
verified one, so a damaged or partial newer save never costs an intact older checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import zlib
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

from meshplan.estimator import errors
from meshplan.launcher.core import faults

_OPTIM_OPTS = StateDictOptions(flatten_optimizer_state_dict=True)
STEP_DIR = re.compile(r"^step-(\d{8})$")
MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"
_CHUNK = 16 * 2**20  # bytes read at a time when checksumming


class CheckpointError(errors.CheckpointError):
    """No usable checkpoint where one is expected, or one that belongs to another plan (meshplan's one error
    hierarchy: a MeshplanError the CLI prints in one line)."""


def _model_state(parts: list[nn.Module]) -> dict[str, Any]:
    """The parts' model state; without their frozen weights (LoRA / QLoRA: the adapters and the buffers only, as
    torchtune saves adapters; the frozen weights come from the pretrained checkpoint, or the seed, again)."""
    from meshplan.launcher.core.model import clean_fqn

    out: dict[str, Any] = {}
    for part in parts:
        state = get_model_state_dict(part)
        frozen = {clean_fqn(n) for n, p in part.named_parameters() if not p.requires_grad}
        out.update({k: v for k, v in state.items() if clean_fqn(k) not in frozen})
    return out


def _optim_state(parts: list[nn.Module], optimizers: list[Optimizer]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part, opt in zip(parts, optimizers, strict=True):
        out.update(get_optimizer_state_dict(part, opt, options=_OPTIM_OPTS))
    return out


def file_digest(path: Path) -> list[int]:
    """[size in bytes, CRC-32] of one file."""
    crc, size = 0, 0
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return [size, crc]


def step_of(path: Path) -> int | None:
    m = STEP_DIR.match(path.name)
    return int(m.group(1)) if m else None


class Checkpointer:
    """Saves and restores model parts, their optimizers, LR schedulers and the data position.

    `fingerprint` names the plan layout the run belongs to; a checkpoint written under another is refused."""

    def __init__(self, root: Path, keep: int = 2, fingerprint: str | None = None, one_process: bool = False) -> None:
        """`one_process`: read checkpoints without a process group (`meshplan export-weights`)."""
        self.root = Path(root)
        self.keep = keep
        self.fingerprint = fingerprint
        self.one_process = one_process
        self.rank = 0 if one_process else dist.get_rank()
        self.world = 1 if one_process else dist.get_world_size()

    def _barrier(self) -> None:
        dist.barrier()

    def _warn(self, text: str) -> None:
        if self.rank == 0:
            print(f"warning: {text}", file=sys.stderr, flush=True)

    def clean_partial(self) -> None:
        """Remove `.tmp` dirs left by a save that was killed (rank 0; call at start-up)."""
        if self.rank == 0 and self.root.exists():
            for tmp in self.root.glob("step-*.tmp"):
                shutil.rmtree(tmp, ignore_errors=True)
        self._barrier()

    # --- finding a checkpoint ----------------------------------------------------------------------------
    def _candidates(self) -> tuple[list[Path], str | None]:
        """Step dirs, newest first, with the pointer's target first when it names one; and what is wrong with
        the pointer (None when it is fine or absent)."""
        steps = sorted((p for p in self.root.glob("step-*") if step_of(p) is not None and p.is_dir()),
                       key=lambda p: step_of(p) or 0, reverse=True)
        pointer = self.root / "latest"
        problem = None
        if pointer.exists():
            name = pointer.read_text(errors="replace").strip()
            target = self.root / name
            if not name:
                problem = "the 'latest' pointer is empty"
            elif not STEP_DIR.match(name):
                problem = f"the 'latest' pointer names {name!r}, not a checkpoint of this folder"
            elif not target.is_dir():
                problem = f"the 'latest' pointer names {name}, which does not exist"
            elif steps and step_of(target) != step_of(steps[0]):
                problem = f"the 'latest' pointer names {name} but {steps[0].name} is newer"
        return steps, problem

    def _verify_local(self, path: Path) -> str | None:
        """This rank's share of the verification of one checkpoint; the problem found, or None."""
        manifest = path / MANIFEST
        try:
            files = json.loads(manifest.read_text())["files"]
            state = json.loads((path / TRAIN_STATE).read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"{path.name}: no readable {MANIFEST} / {TRAIN_STATE} ({type(exc).__name__})"
        if int(state.get("step", -1)) != step_of(path):
            return f"{path.name}: {TRAIN_STATE} says step {state.get('step')}"
        if ".metadata" not in files:
            return f"{path.name}: the manifest lists no .metadata"
        for i, (name, want) in enumerate(sorted(files.items())):
            if i % self.world != self.rank:
                continue
            f = path / name
            if not f.is_file():
                return f"{path.name}: {name} is missing"
            if file_digest(f) != list(want):
                return f"{path.name}: {name} does not match its checksum (damaged)"
        return None

    def verify(self, path: Path) -> str | None:
        """Collective: the first problem any rank found with checkpoint `path`, or None when it is intact."""
        problem = self._verify_local(path)
        if self.one_process:
            return problem
        problems: list[str | None] = [None] * self.world
        dist.all_gather_object(problems, problem)
        return next((p for p in problems if p), None)

    def latest(self) -> Path | None:
        """Collective: the newest intact checkpoint; None when there is none at all. Damaged ones are skipped
        with a warning; CheckpointError when checkpoints (or a pointer) exist but none is intact, or when the
        intact one belongs to another plan."""
        if not self.root.exists():
            return None
        steps, pointer_problem = self._candidates()
        if pointer_problem:
            self._warn(f"{pointer_problem}; looking for the newest intact checkpoint in {self.root}")
        problems = []
        for path in steps:
            problem = self.verify(path)
            if problem is None:
                self.check_owner(path)
                if problems:
                    self._warn(f"skipped damaged checkpoints ({'; '.join(problems)}); resuming from {path.name}")
                return path
            problems.append(problem)
        if problems or pointer_problem:
            raise CheckpointError(
                f"no intact checkpoint in {self.root} ({'; '.join(problems) or pointer_problem}); "
                "move the folder aside to start afresh"
            )
        return None

    def check_owner(self, path: Path) -> None:
        """Refuse a checkpoint written by a run of another plan (a different model or parallel layout)."""
        theirs = json.loads((path / TRAIN_STATE).read_text()).get("fingerprint")
        if self.fingerprint and theirs and theirs != self.fingerprint:
            raise CheckpointError(
                f"{path} belongs to another plan (fingerprint {theirs}, this plan {self.fingerprint}); "
                "give this run its own run directory"
            )

    # --- saving ----------------------------------------------------------------------------------------------
    def save(
        self, step: int, parts: list[nn.Module], optimizers: list[Optimizer], train_state: dict[str, Any]
    ) -> Path:
        """Collective: every rank calls it. Returns the committed, verified checkpoint dir."""
        final = self.root / f"step-{step:08d}"
        tmp = self.root / f"step-{step:08d}.tmp"
        if self.rank == 0:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        self._barrier()
        state = {"model": _model_state(parts), "optim": _optim_state(parts, optimizers)}
        dcp.save(state, checkpoint_id=str(tmp))
        if self.rank == 0:
            ts = {"step": step, "fingerprint": self.fingerprint, **train_state}
            (tmp / TRAIN_STATE).write_text(json.dumps(ts, indent=1))
        self._barrier()
        faults.point("kill_in_save", step)
        names = sorted(p.name for p in tmp.iterdir() if p.is_file())
        mine = {n: file_digest(tmp / n) for i, n in enumerate(names) if i % self.world == self.rank}
        gathered: list[dict[str, list[int]]] = [{}] * self.world
        dist.all_gather_object(gathered, mine)
        if self.rank == 0:
            files = {k: v for part in gathered for k, v in part.items()}
            (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=1))
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            pointer_tmp = self.root / "latest.tmp"
            pointer_tmp.write_text(final.name)
            os.replace(pointer_tmp, self.root / "latest")
        self._barrier()
        if self.verify(final) is None:  # only a verified newer checkpoint lets older ones go
            if self.rank == 0:
                self._prune(final)
        else:
            self._warn(f"{final.name} did not verify after saving; keeping every older checkpoint")
        self._barrier()
        return final

    def _prune(self, newest: Path) -> None:
        """Keep the newest verified checkpoint and the `keep - 1` before it; remove older ones only."""
        newest_step = step_of(newest) or 0
        older = sorted((p for p in self.root.glob("step-*") if (step_of(p) or newest_step) < newest_step
                        and p.is_dir()), key=lambda p: step_of(p) or 0)
        for old in older[: max(0, len(older) - (self.keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)

    def load(self, path: Path, parts: list[nn.Module], optimizers: list[Optimizer]) -> dict[str, Any]:
        """Restore parts and optimizers in place; returns train_state (step, data, scheduler)."""
        state = {"model": _model_state(parts), "optim": _optim_state(parts, optimizers)}
        dcp.load(state, checkpoint_id=str(path))
        for part in parts:
            set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
        for part, opt in zip(parts, optimizers, strict=True):
            set_optimizer_state_dict(part, opt, optim_state_dict=state["optim"], options=_OPTIM_OPTS)
        return json.loads((path / TRAIN_STATE).read_text())
