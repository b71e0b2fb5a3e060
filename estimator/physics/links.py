"""Achievable link bandwidths of a hardware profile (bytes/s per GPU), the one place the collective, pipeline
and expert-parallel terms read them from (a leaf module: no other physics module is imported here)."""

from __future__ import annotations

from meshplan.estimator import xp
from meshplan.estimator.hardware import HardwareProfile


def mesh_rings(ranks):
    """Edge-disjoint directed rings through `ranks` GPUs wired all-to-all (no switch): the complete symmetric
    digraph on k vertices splits into k - 1 directed Hamiltonian cycles, except at k = 4 (and 6), where at most
    2 fit; a ring collective on such a group streams over that many pair links at once."""
    k = xp.maximum(xp.as_float(ranks), 2.0)
    return xp.where(k == 4, 2.0, k - 1)


def _scale_up_bytes_per_s(hw: HardwareProfile, pair_links=None):
    """The scale-up link x its ring efficiency, bytes/s per GPU; on a switchless node (`nvlink_pair_gbs`) capped at
    `pair_links` pair links (None: the whole link, as behind a switch)."""
    full = hw.intra_node_gbs * 1e9 * hw.intra_node_efficiency
    if hw.nvlink_pair_gbs is None or pair_links is None:
        return full
    return xp.minimum(full, hw.nvlink_pair_gbs * 1e9 * hw.intra_node_efficiency * pair_links)


def intra_node_bytes_per_s(hw: HardwareProfile, ranks=None):
    """Achievable ring-collective bandwidth inside a node, bytes/s per GPU: the scale-up link (GB/s per direction)
    x its ring efficiency. On a node without an NVLink switch (`nvlink_pair_gbs`: HGX 4-GPU boards) a group of
    `ranks` of its GPUs gets only the pair links of its rings: 2 GPUs one pair link, 3 or 4 GPUs two."""
    return _scale_up_bytes_per_s(hw, None if ranks is None else mesh_rings(ranks))


def intra_node_all_to_all_bytes_per_s(hw: HardwareProfile, ranks):
    """What one GPU sends to the other `ranks` - 1 GPUs of its node at once in an all-to-all, bytes/s (before the
    stack's all-to-all efficiency): the switch port, or on a switchless board its direct links to each peer."""
    return _scale_up_bytes_per_s(hw, xp.maximum(xp.as_float(ranks) - 1.0, 1.0))


def inter_node_bytes_per_s(hw: HardwareProfile) -> float:
    """Achievable ring-collective bandwidth across nodes, bytes/s per GPU: the NIC line rate (Gb/s) / 8 x NCCL's
    efficiency across nodes."""
    return nic_bytes_per_s(hw) * hw.inter_node_efficiency


def nic_bytes_per_s(hw: HardwareProfile) -> float:
    """A GPU's NIC line rate across nodes, bytes/s (the profile's Gb/s / 8), before any library's efficiency."""
    return hw.inter_node_gbps / 8 * 1e9
