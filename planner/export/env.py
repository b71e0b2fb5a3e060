"""Environment defaults for launch scripts, kept in `data/launch/env.yaml` (`meshplan.data` when installed).

Scripts export each one as `export NAME="${NAME:-value}"`, so anything already set by the user wins.
Values are restricted to shell-inert tokens: `shlex.quote(value) == value`, which is what lets them sit
inside double quotes in the generated scripts without any further escaping.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from meshplan.estimator import data_files
from meshplan.estimator.errors import MeshplanError

BACKENDS = ("torchrun", "slurm", "mpirun")
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


class EnvVar(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    value: str = Field(min_length=1)
    why: str = Field(min_length=1, description="why the default is set; the scripts carry it as a comment")

    @field_validator("value", mode="before")
    @classmethod
    def _value(cls, v: object) -> object:
        if isinstance(v, bool):  # YAML `true` would silently become "True"
            raise ValueError("write the value as a quoted string")
        if isinstance(v, int | float):
            v = str(v)
        if isinstance(v, str) and not _SAFE_VALUE.match(v):
            raise ValueError("only letters, digits and _ @ % + = : , . / - are allowed (shell-inert)")
        return v


class EnvDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    common: list[EnvVar] = Field(default_factory=list)
    torchrun: list[EnvVar] = Field(default_factory=list)
    slurm: list[EnvVar] = Field(default_factory=list)
    mpirun: list[EnvVar] = Field(default_factory=list)

    @field_validator("common", "torchrun", "slurm", "mpirun")
    @classmethod
    def _unique(cls, v: list[EnvVar]) -> list[EnvVar]:
        names = [e.name for e in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate variable {dup[0]}")
        return v

    def for_backend(self, backend: str) -> list[EnvVar]:
        """`common` plus the backend's own entries; a backend entry replaces a common one of the same name."""
        if backend not in BACKENDS:
            raise MeshplanError(f"unknown launch backend '{backend}'; choose one of: {', '.join(BACKENDS)}")
        extra = getattr(self, backend)
        names = {e.name for e in extra}
        return [e for e in self.common if e.name not in names] + list(extra)


def default_env_path() -> Path:
    return data_files.data_dir("launch") / "env.yaml"


def load_env_defaults(path: str | Path | None = None) -> EnvDefaults:
    """Read and validate an env-defaults file (default: the built-in one); one-line MeshplanError on problems."""
    path = Path(path) if path is not None else default_env_path()
    if not path.exists():
        raise MeshplanError(f"environment defaults file not found: {path}")
    raw = data_files.read_yaml(path)
    try:
        env = EnvDefaults.model_validate(raw)
    except ValidationError as exc:
        raise data_files.one_line(exc, f"environment defaults {path.name}") from None
    for backend in BACKENDS:  # belt and braces: the scripts rely on this
        for e in env.for_backend(backend):
            assert shlex.quote(e.value) == e.value, e
    return env
