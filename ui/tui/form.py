"""The form of the terminal UI: its fields, defaults and parsing, and number formatting (pure, light:
no numpy, estimator or Textual, so the app can paint before those load)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from meshplan.estimator.config import RESHARD_POLICIES, TRAINING_DTYPES
from meshplan.estimator.limits import MAX_GLOBAL_BATCH, MAX_GPUS_PER_NODE, MAX_NODES, MAX_SEQ_LEN, MAX_TOKENS
from meshplan.planner.labels import OBJECTIVES

# The form: field -> (label, default). Values are text as typed; `parse_form` turns them into Inputs.
FIELDS = {
    "model": ("model", "llama3-70b"),
    "hardware": ("hardware", "h100-sxm"),
    "objective": ("objective", "throughput"),
    "nodes": ("nodes", "8"),
    "gpus_per_node": ("GPUs/node", ""),
    "seq_len": ("seq len", "8192"),
    "batch": ("batch", "4Mi tok"),
    "tokens": ("tokens", "2T"),
    "margin": ("margin", "0.9"),
    "train": ("train", "pretrain"),
    "offload": ("offload", "auto"),
    "lora_rank": ("LoRA r", "16"),
    "dtype": ("dtype", "float32"),
    "reshard": ("reshard", "default"),
}
# the training field: pre-training, or fine-tuning a pretrained checkpoint (TrainConfig's `finetune` names)
TRAIN_MODES = {"pretrain": "none", "full": "full", "lora": "lora", "qlora": "qlora"}
OFFLOAD_CHOICES = ("auto", "on", "off")  # FSDP CPU offload: the planner's choice, or pinned
DEFAULTS = {k: v[1] for k, v in FIELDS.items()}
# The hardware comparison: these profiles plus the one in the form, at the same number of GPUs.
# Export: format -> file suffix (the same names the web app's downloads use).
EXPORTS = {
    "torchtitan-toml": ".toml",
    "torchtitan-py": "meshplan_job.py",  # torchtitan 0.3 imports it by module name (--module meshplan_job): fixed
    "torchtitan-cli": "-torchtitan.sh",
    "torchrun": "-torchrun.sh",
    "slurm": ".sbatch",
    "mpirun": "-mpirun.sh",
}
LAUNCH_BACKENDS = ("torchrun", "slurm", "mpirun")
TABLE_ROWS = 500  # rows of the ranked table (the sort runs over every fitting configuration)
SORTS = {  # key -> (column label, ascending by default)
    "rank": ("#", True),
    "peak": ("GiB", True),
    "tps": ("tok/s", False),
    "mfu": ("MFU", False),
    "step": ("step s", True),
    "days": ("train", True),
    "cost": ("cost", True),
    "config": ("configuration", True),
}

_MULT = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30}
_NUM = re.compile(r"^([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(ki|mi|gi|k|m|g|b|t)?$", re.IGNORECASE)


class FieldError(ValueError):
    """A one-line input error that belongs to one field of the form."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field = field_name


def parse_number(text: str) -> float:
    """`512`, `2e12`, `2T`, `4Mi`, `1.5k` (k/M/G/B/T decimal, Ki/Mi/Gi binary), `1,000` -> float."""
    m = _NUM.match(text.strip().replace(",", "").replace("_", ""))
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * _MULT[(m.group(2) or "").lower()]


def _int(text: str, name: str, lo: int, hi: int) -> int:
    try:
        value = parse_number(text)
    except ValueError:
        raise FieldError(name, f"{FIELDS[name][0]}: {text.strip()!r} is not a number") from None
    if not math.isfinite(value) or value > hi:  # before int(): 1e400 is inf
        raise FieldError(name, f"{FIELDS[name][0]}: must be in {lo:,}..{hi:,}, got {text.strip()}")
    if value != int(value):
        raise FieldError(name, f"{FIELDS[name][0]}: must be a whole number, got {text.strip()}")
    if not lo <= value <= hi:
        raise FieldError(name, f"{FIELDS[name][0]}: must be in {lo:,}..{hi:,}, got {int(value):,}")
    return int(value)


@dataclass(frozen=True)
class Inputs:
    """The form, parsed. `batch` is in sequences, or in tokens when `batch_tokens`."""

    model: str
    hardware: str
    objective: str
    nodes: int
    gpus_per_node: int | None
    seq_len: int
    batch: int
    batch_tokens: bool
    tokens: float | None
    margin: float
    train: str = "pretrain"  # a TRAIN_MODES key
    offload: str = "auto"  # an OFFLOAD_CHOICES value
    lora_rank: int = 16
    dtype: str = "float32"  # torchtitan's training.dtype: a TRAINING_DTYPES value
    reshard: str = "default"  # torchtitan's parallelism.fsdp_reshard_after_forward: a RESHARD_POLICIES value
    stack: str = "torchtitan"  # the stack profile (`meshplan tui --stack`): a built-in id or a YAML path; not a field
    ep_backend: str = "standard"  # the experts' dispatch where EP runs (`meshplan tui --ep-comm-backend`); not a field
    document_tokens: int | None = None  # mean tokens of a packed document (`meshplan tui --document-tokens`); not a field

    def space_fields(self) -> dict:
        """The training inputs as SearchSpace fields (pre-training with the planner's offload choice: none)."""
        out: dict = {"finetune": TRAIN_MODES[self.train], "lora_rank": self.lora_rank, "dtype": self.dtype,
                     "fsdp_reshard_after_forward": self.reshard, "expert_parallel_comm_backend": self.ep_backend,
                     "document_tokens": self.document_tokens}
        if self.offload != "auto":
            out["cpu_offload"] = [self.offload == "on"]
        return out

    def sequences(self) -> int:
        if not self.batch_tokens:
            return self.batch
        if self.batch % self.seq_len:
            raise FieldError("batch", f"batch: {self.batch:,} tokens is not a whole number of "
                                      f"{self.seq_len:,}-token sequences")
        return self.batch // self.seq_len


def parse_form(raw: dict[str, str]) -> tuple[Inputs | None, dict[str, str]]:
    """The form's text -> (Inputs, {}) or (None, {field: one-line error})."""
    errors: dict[str, str] = {}
    out: dict = {}

    def take(name, fn):
        try:
            out[name] = fn(raw.get(name, DEFAULTS[name]).strip())
        except FieldError as exc:
            errors[exc.field] = str(exc)

    def text_field(name):
        def fn(text):
            if not text:
                raise FieldError(name, f"{name}: give a preset name or a path to a file")
            return text
        return fn

    def objective(text):
        if text not in OBJECTIVES:
            raise FieldError("objective", f"objective: one of {', '.join(OBJECTIVES)}")
        return text

    def gpn(text):
        return _int(text, "gpus_per_node", 1, MAX_GPUS_PER_NODE) if text else None

    def batch(text):
        m = re.match(r"^(.*?)\s*(tokens|token|tok|sequences|sequence|seqs|seq)?$", text, re.IGNORECASE)
        unit = (m.group(2) or "seq").lower()
        out["batch_tokens"] = unit.startswith("tok")
        return _int(m.group(1), "batch", 1, MAX_GLOBAL_BATCH)

    def tokens(text):
        if not text or text in ("0", "-", "none"):
            return None
        try:
            value = parse_number(text)
        except ValueError:
            raise FieldError("tokens", f"tokens: {text!r} is not a token count (e.g. 2T, 2e12, 500B; empty: none)") from None
        if value <= 0:
            raise FieldError("tokens", "tokens: must be positive (empty: no time-to-train)")
        if not math.isfinite(value) or value > MAX_TOKENS:
            raise FieldError("tokens", f"tokens: {text} is too large (at most {MAX_TOKENS:.0e})")
        return value

    def margin(text):
        pct = text.endswith("%")
        try:
            value = float(text.rstrip("%").strip()) / (100 if pct else 1)
        except ValueError:
            raise FieldError("margin", f"margin: {text!r} is not a fraction (e.g. 0.9 or 90%)") from None
        if not 0 < value <= 1:
            raise FieldError("margin", f"margin: must be in (0, 1] (a fraction of usable HBM), got {text}")
        return value

    take("model", text_field("model"))
    take("hardware", text_field("hardware"))
    take("objective", objective)
    take("nodes", lambda t: _int(t, "nodes", 1, MAX_NODES))
    take("gpus_per_node", gpn)
    take("seq_len", lambda t: _int(t, "seq_len", 1, MAX_SEQ_LEN))
    take("batch", batch)
    take("tokens", tokens)
    def choice(name, options):
        def fn(text):
            if text.lower() not in options:
                raise FieldError(name, f"{FIELDS[name][0]}: one of {', '.join(options)}, got {text!r}")
            return text.lower()
        return fn

    take("margin", margin)
    take("train", choice("train", tuple(TRAIN_MODES)))
    take("offload", choice("offload", OFFLOAD_CHOICES))
    take("lora_rank", lambda t: _int(t, "lora_rank", 1, 4096))
    take("dtype", choice("dtype", TRAINING_DTYPES))
    take("reshard", choice("reshard", RESHARD_POLICIES))
    if errors:
        return None, errors
    inp = Inputs(**out)
    try:
        inp.sequences()
    except FieldError as exc:
        return None, {exc.field: str(exc)}
    return inp, {}


# ---- formatting ----------------------------------------------------------------------------------------

def fmt_days(days: float | None) -> str:
    if days is None:
        return "-"
    if days < 1:
        return f"{days * 24:.1f} h"
    return f"{days:,.1f} d" if days < 100 else f"{days:,.0f} d"


def fmt_money(usd: float | None) -> str:
    if usd is None:
        return "-"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if usd >= div:
            return f"${usd / div:,.2f}{unit}" if usd / div < 100 else f"${usd / div:,.0f}{unit}"
    return f"${usd:,.0f}"


def fmt_tokens(tokens: float) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if tokens >= div:
            return f"{tokens / div:g}{unit}"
    return f"{tokens:,.0f}"


def fmt_count(n: float) -> str:
    """1234 -> 1,234; 526033 -> 526k; 12.3e6 -> 12.3M."""
    if n >= 1e7:
        return f"{n / 1e6:,.0f}M"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e4:
        return f"{n / 1e3:,.0f}k"
    return f"{n:,.0f}"
