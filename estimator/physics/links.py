"""Achievable link bandwidths of a hardware profile (bytes/s per GPU), the one place the collective, pipeline
and expert-parallel terms read them from (a leaf module: no other physics module is imported here)."""

from __future__ import annotations

from meshplan.estimator.hardware import HardwareProfile


def intra_node_bytes_per_s(hw: HardwareProfile) -> float:
    """Achievable ring-collective bandwidth inside a node, bytes/s per GPU: the scale-up link (GB/s per direction)
    x its ring efficiency."""
    return hw.intra_node_gbs * 1e9 * hw.intra_node_efficiency


def inter_node_bytes_per_s(hw: HardwareProfile) -> float:
    """Achievable ring-collective bandwidth across nodes, bytes/s per GPU: the NIC line rate (Gb/s) / 8 x NCCL's
    efficiency across nodes."""
    return hw.inter_node_gbps / 8 * 1e9 * hw.inter_node_efficiency
