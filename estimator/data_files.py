"""Where meshplan's data files live: `data/` beside `estimator/`, in a checkout and in the wheel (`meshplan/data`)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from meshplan.estimator.errors import MeshplanError

T = TypeVar("T", bound=BaseModel)


DATA_ROOT = Path(__file__).resolve().parents[1] / "data"  # resolved once: an estimate reads it several times


@functools.cache  # one Path per kind: joining paths costs more than an estimate's arithmetic
def data_dir(kind: str) -> Path:
    """Folder of one kind of data file (`hardware_profiles`, `models`, `stacks`, `launch`): `data/<kind>` of the
    checkout, or `meshplan/data/<kind>` of an installed wheel (the same place relative to this file)."""
    return DATA_ROOT / kind


@functools.cache
def _names(kind: str) -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in data_dir(kind).glob("*.yaml")))


def names(kind: str) -> list[str]:
    """Built-in names of one kind, sorted (file stems); the folder is listed once per process."""
    return list(_names(kind))


def not_utf8(path: Path, exc: UnicodeDecodeError) -> MeshplanError:
    """The one-line error for a file that is not UTF-8 text (a binary file, UTF-16, Latin-1, ...)."""
    return MeshplanError(
        f"{path} is not UTF-8 text (undecodable byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
        "give a text file saved as UTF-8"
    )


def read_text(path: Path) -> str:
    """A user's text file as str (UTF-8, a leading BOM allowed); one-line MeshplanError if unreadable or binary."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise MeshplanError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise not_utf8(path, exc) from None


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where PyYAML has it (~10x faster)


def safe_load(text: str):
    """yaml.safe_load with libyaml's parser when available: the same documents, the same errors (YAMLError)."""
    return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader


def read_yaml(path: Path) -> dict:
    """Parse a YAML mapping, turning every failure into a one-line MeshplanError."""
    text = read_text(path)
    try:
        obj = safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise MeshplanError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(obj, dict):
        raise MeshplanError(f"{path} must hold a YAML mapping of fields, not {type(obj).__name__}")
    return obj


def one_line(exc: ValidationError, what: str) -> MeshplanError:
    """Condense a pydantic ValidationError to one line naming the first bad field."""
    errs = exc.errors()
    parts = []
    for err in errs[:3]:
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        parts.append(f"{loc}: {err['msg']}")
    more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
    return MeshplanError(f"invalid {what}: " + "; ".join(parts) + more)


def name_key(name: str) -> str:
    """A name reduced to lowercase letters and digits, the form names are matched in whatever their case and
    punctuation (`NVIDIA H100 80GB HBM3` -> `nvidiah10080gbhbm3`)."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def names_a_file(name_or_path: str) -> bool:
    """Whether `load_named` reads `name_or_path` as a file (a YAML suffix, or something that exists) rather than
    as a built-in name."""
    path = Path(name_or_path)
    return path.suffix in (".yaml", ".yml") or path.exists()


def beside(ref: str, path: Path) -> str:
    """`ref` (a name or a YAML path one file names, as in `extends:`) with a relative path read from the folder of
    `path`, the file that names it, where a file is there; else `ref` as written (a built-in name, or a path from
    the current folder)."""
    if names_a_file(ref) and not Path(ref).is_absolute() and (path.parent / ref).is_file():
        return os.path.normpath(path.parent / ref)
    return ref


def over_base(raw: dict, base: dict, nested: tuple[str, ...]) -> dict:
    """A profile's YAML mapping laid over the profile it `extends:` (`base`, as dumped): its own keys win, and the
    mappings named in `nested` (efficiencies, sources, ...) merge key by key."""
    out = {**base, **raw}
    for key in nested:
        if isinstance(raw.get(key), dict) and isinstance(base.get(key), dict):
            out[key] = {**base[key], **raw[key]}
    return out


def load_named(
    kind: str, name_or_path: str, cls: type[T], what: str, prepare: Callable[[dict, Path], dict] | None = None
) -> T:
    """Load a built-in entry by name, or a YAML file by path, into `cls`; `prepare(raw, file path)` may
    rewrite the YAML mapping first (a stack profile's `extends:`)."""
    path = Path(name_or_path)
    if not names_a_file(name_or_path):
        path = data_dir(kind) / f"{name_or_path}.yaml"
        if not path.exists():
            known = ", ".join(names(kind))
            raise MeshplanError(f"unknown {what} '{name_or_path}'; choose one of: {known}, or pass a path to a YAML file")
    elif not path.exists():
        raise MeshplanError(f"{what} file not found: {path}")
    raw = read_yaml(path)
    if prepare is not None:
        raw = prepare(raw, path)
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise one_line(exc, f"{what} {path.name}") from None
