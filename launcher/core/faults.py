"""Opt-in fault injection for crash/restart tests: real signals at exact points, set by `MESHPLAN_FAULT`.

`MESHPLAN_FAULT="kill:rank=1:step=4,kill_in_save:rank=0:step=4,signal:rank=0:step=3:sig=TERM"`
- `kill`: the rank SIGKILLs itself after finishing that step;
- `kill_in_save`: SIGKILL after the DCP shards of that step's checkpoint are written, before it is committed;
- `signal`: the rank sends itself the signal (TERM, USR1) after that step, as Slurm preemption would.
Faults fire only in the first attempt of a torchrun job (TORCHELASTIC_RESTART_COUNT unset or 0).
"""

from __future__ import annotations

import os
import signal


def _faults() -> list[dict[str, str]]:
    spec = os.environ.get("MESHPLAN_FAULT", "")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return []
    out = []
    for item in spec.split(","):
        name, *fields = item.split(":")
        out.append({"name": name, **dict(f.split("=", 1) for f in fields)})
    return out


def point(name: str, step: int) -> None:
    """Fire the faults registered for (name, this rank, step)."""
    rank = int(os.environ.get("RANK", "0"))
    for fault in _faults():
        if fault["name"] != name or int(fault.get("rank", 0)) != rank or int(fault["step"]) != step:
            continue
        if name in ("kill", "kill_in_save"):
            os.kill(os.getpid(), signal.SIGKILL)
        elif name == "signal":
            os.kill(os.getpid(), getattr(signal, "SIG" + fault.get("sig", "TERM")))
