"""Hardware profiles: one YAML file per accelerator in `data/hardware_profiles/`, every number sourced.

A user adds a profile by dropping a YAML file there or by passing its path wherever a name is taken.
Units: TFLOP/s are dense, decimal (1e12); memory in GiB (2**30 bytes); HBM bandwidth in TB/s (1e12 B/s);
link bandwidths in GB/s (1e9 B/s) per GPU per direction; network in Gb/s per GPU.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshplan.estimator import data_files, xp
from meshplan.estimator.errors import MeshplanError

GIB = 2**30


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid")

    usd_per_gpu_hour: float = Field(gt=0)
    date: str = Field(description="when the list price was read, YYYY-MM-DD")
    offering: str = ""


class Efficiency(BaseModel):
    """Fractions of peak that the time model uses; each comes with its source in `sources`."""

    model_config = ConfigDict(extra="forbid")

    gemm_bf16: float = Field(gt=0, le=1, description="best-shape bf16 matmul throughput / bf16 peak (MAMF)")
    gemm_fp8: float | None = Field(default=None, gt=0, le=1, description="best-shape fp8 matmul / fp8 peak")
    attention: float = Field(gt=0, le=1, description="flash-attention fwd+bwd throughput / bf16 peak")
    attention_cudnn: float | None = Field(
        default=None, gt=0, le=1, description="cuDNN's fused SDPA fwd+bwd throughput / bf16 peak, where measured (a "
                                              "stack whose sdpa_backend is cudnn runs it; else `attention`)")
    hbm: float = Field(default=0.8, gt=0, le=1, description="achieved / peak HBM bandwidth, memory-bound ops")
    clock: float = Field(default=1.0, gt=0, le=1, description="sustained clock under the power cap / boost")


class HardwareProfile(BaseModel):
    """One accelerator as deployed in a node."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)
    name: str
    aliases: list[str] = Field(
        default_factory=list,
        description="other names of the part (nvidia-smi / rocm-smi device names, the short name a run log gives); "
                    "--hardware and a runs CSV's hardware column take them in any case and punctuation",
    )
    vendor: str
    peak_tflops_bf16: float = Field(gt=0, description="dense bf16 tensor TFLOP/s")
    peak_tflops_fp8: float | None = Field(default=None, gt=0, description="dense fp8 tensor TFLOP/s; null: no fp8")
    peak_tflops_fp32: float | None = Field(default=None, gt=0, description="dense fp32 (non-tensor) TFLOP/s; null: "
                                           "a sixteenth of the bf16 peak")
    mx_formats: bool = Field(default=False, description="hardware MX (block-scaled) fp8 support, e.g. Blackwell")
    hbm_total_gib: float = Field(gt=0, description="device-reported total memory, GiB")
    runtime_reserve_gib: float = Field(
        default=1.0, ge=0, description="CUDA/ROCm context, NCCL and library workspaces outside torch's allocator"
    )
    hbm_bandwidth_tbs: float = Field(gt=0)
    gpus_per_node: int = Field(gt=0, description="GPUs per host (one launcher per node, host RAM per node)")
    scale_up_domain_gpus: int | None = Field(
        default=None, gt=0,
        description="GPUs one scale-up fabric joins (NVLink switch domain), where it spans several hosts: a GB200 "
                    "NVL72 rack joins 72 GPUs of 18 four-GPU trays, so TP, CP, EP and FSDP groups of up to 72 "
                    "ranks ride NVLink (intra_node_gbs) between trays; none: the node (gpus_per_node)")
    intra_node_gbs: float = Field(gt=0, description="per-GPU unidirectional scale-up bandwidth, GB/s")
    intra_node_efficiency: float = Field(gt=0, le=1.2, description="ring-collective busbw / intra_node_gbs")
    nvlink_pair_gbs: float | None = Field(
        default=None, gt=0,
        description="GB/s per direction between two GPUs of a node without an NVLink switch (HGX 4-GPU boards: each "
                    "pair is linked directly by a third of every GPU's lanes), which caps what a group of the node's "
                    "GPUs gets; none where a switch gives any group intra_node_gbs")
    inter_node_gbps: float = Field(gt=0, description="per-GPU scale-out line rate, Gb/s")
    inter_node_efficiency: float = Field(gt=0, le=1, description="NCCL busbw / line rate across nodes")
    intra_node_latency_us: float = Field(ge=0, description="latency of one ring step inside a node, microseconds")
    inter_node_latency_us: float = Field(ge=0, description="latency of one ring step across nodes, microseconds")
    inter_node_scaling: float = Field(
        default=0.0,
        ge=0,
        description=(
            "loss of achieved network bandwidth per doubling of nodes beyond two; 0 by default: the published"
            " torchtitan runs up to 64 nodes show no measurable loss; raise it for fabrics like the Ultra-Scale"
            " Playbook's (all-gather busbw 185 -> 11 GB/s from 2 to 64 nodes)"
        ),
    )
    host_ram_gib_per_node: float = Field(default=2048, gt=0, description="typical host DRAM per node, GiB")
    host_link_gbs: float | None = Field(default=None, gt=0, description="achievable pinned host-to-device copy "
                                        "bandwidth per GPU per direction (PCIe / NVLink-C2C), GB/s; none: unknown")
    host_memory_bandwidth_gbs: float | None = Field(default=None, gt=0, description="host DRAM bandwidth per node "
                                                    "(theoretical), GB/s; none: unknown")
    price: Price | None = None
    efficiency: Efficiency
    sources: dict[str, str] = Field(default_factory=dict, description="field -> where the number comes from")

    @model_validator(mode="after")
    def _check(self) -> HardwareProfile:
        if self.peak_tflops_fp8 is not None and self.efficiency.gemm_fp8 is None:
            raise ValueError("efficiency.gemm_fp8 is required when peak_tflops_fp8 is set")
        if self.hbm_total_gib <= self.runtime_reserve_gib:
            raise ValueError(f"hbm_total_gib ({self.hbm_total_gib:g}) must exceed the runtime reserve "
                             f"({self.runtime_reserve_gib:g} GiB) that torch's allocator cannot use")
        return self

    @property
    def supports_fp8(self) -> bool:
        return self.peak_tflops_fp8 is not None

    def scale_up_gpus(self, gpus_per_node=None):
        """GPUs joined by the scale-up fabric (NVLink) for nodes of `gpus_per_node` GPUs (default: the profile's; a
        number, or an array of the estimator's configurations): the NVLink domain where it spans hosts, else the
        node. Groups of at most this many consecutive ranks ride NVLink; larger ones cross the network."""
        gpn = self.gpus_per_node if gpus_per_node is None else gpus_per_node
        return xp.maximum(gpn, self.scale_up_domain_gpus or 0)

    @property
    def usable_hbm_gib(self) -> float:
        """What torch's caching allocator can reserve: device total minus the runtime's own reserve."""
        return self.hbm_total_gib - self.runtime_reserve_gib


def hardware_names() -> list[str]:
    return data_files.names("hardware_profiles")


@functools.cache
def _aliases(folder: str) -> dict[str, str]:
    """key of every built-in profile's id, name and aliases -> its id (the profiles in `folder`, read once)."""
    out: dict[str, str] = {}
    for hw_id in hardware_names():
        hw = _load(hw_id)
        for name in (hw.id, hw.name, *hw.aliases):
            out.setdefault(data_files.name_key(name), hw.id)
    return out


# words a part's name carries that do not tell parts apart: the vendor, the product line, the memory's type, the
# SXM / OAM module (the profiles' default form; PCIe and NVL parts keep their word), the server it sits in
_NOISE_WORDS = re.compile(r"^(nvidia|amd|instinct|tesla|gpu|hbm\w*|sxm\d?|oam|dgx|hgx)$")
_SIZE_WORD = re.compile(r"(\d+)gb?")  # a memory size in a part's name: `141gb`, `96g`


def _words(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", name.lower())


def _words_key(name: str, keep_size: bool = True) -> str:
    """A name as the set of its words less `_NOISE_WORDS` (and, with `keep_size` false, its memory size such as
    `141GB`), sorted: `NVIDIA H200 141GB HBM3e` and `H200-SXM-141GB` -> `141gb h200`."""
    kept = {w for w in _words(name) if not _NOISE_WORDS.match(w) and (keep_size or not _SIZE_WORD.fullmatch(w))}
    return " ".join(sorted(kept))


@functools.cache
def _word_aliases(folder: str, keep_size: bool) -> dict[str, str]:
    """`_words_key` of every built-in profile's id, name and aliases -> its id, without the keys two parts share
    (`H100` with its size dropped would name both the 80 GB and the 96 GB part)."""
    out: dict[str, set[str]] = {}
    for hw_id in hardware_names():
        hw = _load(hw_id)
        for name in (hw.id, hw.name, *hw.aliases):
            out.setdefault(_words_key(name, keep_size), set()).add(hw.id)
    return {key: next(iter(ids)) for key, ids in out.items() if key and len(ids) == 1}


def resolve_hardware_name(name: str) -> str | None:
    """The built-in profile id a part's name stands for (its id, its profile name or one of its aliases, in any case
    and punctuation: `H100`, `NVIDIA H100 80GB HBM3` -> `h100-sxm`), else the one profile whose names hold the same
    words once vendor, memory type and module words are set aside (`H200-SXM-141GB`, `NVIDIA H200 141GB HBM3e` ->
    `h200-sxm`), else, for a name that gives a memory size, the one whose names do without it where that size is its
    memory (`B200 192GB`); None when no profile (or more than one) has that name. A name without a size never takes
    a part whose size sets it apart (`H100 500W` is not the 96 GB 500 W part)."""
    key = data_files.name_key(name)
    if not key:
        return None
    folder = str(data_files.data_dir("hardware_profiles"))
    found = _aliases(folder).get(key) or _word_aliases(folder, True).get(_words_key(name))
    sizes = [float(m.group(1)) for w in _words(name) if (m := _SIZE_WORD.fullmatch(w))]
    if found is None and sizes:  # a size the aliases do not spell (`B200 192GB`), if it is that part's memory
        found = _word_aliases(folder, False).get(_words_key(name, keep_size=False))
        if found is not None and not _size_fits(found, sizes[0]):
            return None  # `A100 40GB PCIe`: a size the one profile of that name does not have is another part
    return found


def _size_fits(hw_id: str, size: float) -> bool:
    """Whether a name's memory size (`192GB`, in GB or GiB as vendors and tools write it) is the profile's device
    memory, within 12 % (B200: 192 GB marketed, 179 GiB in nvidia-smi; H200: 141 GB, 140.4 GiB)."""
    total = _load(hw_id).hbm_total_gib
    return any(abs(size - t) <= 0.12 * t for t in (total, total * GIB / 1e9))


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A built-in profile id (`h100-sxm`), another name of a built-in part (`H100`, nvidia-smi's `NVIDIA H100 80GB
    HBM3`: `aliases` in the profiles) or a path to a profile YAML."""
    text = str(name_or_path)
    if not data_files.names_a_file(text) and text not in hardware_names():
        text = resolve_hardware_name(text) or text  # an unknown name: load_named's one-line error lists the ids
    return _load(text)


_EXTENDING: set[str] = set()  # profiles whose `extends:` chain is being resolved (a cycle is an error)


def _load(name_or_path: str) -> HardwareProfile:
    """A built-in profile id or a profile YAML's path, with the profile it `extends:` filled in underneath."""
    return data_files.load_named("hardware_profiles", name_or_path, HardwareProfile, "hardware profile",
                                 prepare=_extends)


def _extends(raw: dict, path: Path) -> dict:
    """A profile that `extends:` another (the same part on another board, say) lists only what differs; the
    efficiencies and sources merge key by key, and the other part's names (`aliases`) are not inherited."""
    base_id = raw.pop("extends", None)
    if base_id is None:
        return raw
    if isinstance(base_id, str):
        base_id = data_files.beside(base_id, path)  # a relative path from the extending file's folder
    if not isinstance(base_id, str) or base_id == raw.get("id") or base_id in _EXTENDING:
        raise MeshplanError(f"hardware profile {path.name}: 'extends' must name another hardware profile, "
                            "without a cycle")
    _EXTENDING.add(base_id)
    try:
        base = load_hardware(base_id).model_dump()
    finally:
        _EXTENDING.discard(base_id)
    base["aliases"] = []
    return data_files.over_base(raw, base, ("efficiency", "sources"))


@functools.lru_cache(maxsize=64)
def hardware_label(cell: str) -> str:
    """What a run's hardware cell is called in summaries: the built-in profile id its name stands for, a profile
    YAML's own id, else the cell as written (a name no profile has)."""
    cell = (cell or "").strip()
    if data_files.names_a_file(cell):
        try:
            return load_hardware(cell).id
        except MeshplanError:
            return cell
    return resolve_hardware_name(cell) or cell
