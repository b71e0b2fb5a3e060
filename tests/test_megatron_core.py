"""Megatron-Core's profile: its interleaved schedule overlaps the stage-to-stage transfers with compute
(overlap_p2p_comm), where torch.distributed.pipelining's schedule (torchtitan) and Megatron's own schedule without
virtual stages (batch_p2p_comm) wait on them."""

from __future__ import annotations

import pytest

from meshplan.estimator.arrays import ConfigArrays
from meshplan.estimator.config import TrainConfig
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import load_model
from meshplan.estimator.physics import pipeline
from meshplan.estimator.physics.layout import layout_of
from meshplan.estimator.report import estimate
from meshplan.estimator.stack import load_stack
from meshplan.estimator.validate import row_stack

H100 = load_hardware("h100-sxm")
L70 = load_model("llama3-70b")


def _p2p(stack: str, **kw) -> dict:
    base = dict(gpus=64, tp=8, pp=4, dp_shard=2, seq_len=4096, global_batch_size=64, micro_batch_size=1)
    base.update(kw)
    return estimate(L70, H100, TrainConfig(**base), load_stack(stack))["throughput"]


def test_the_profile_is_generic_with_megatrons_pipeline_overlap():
    mc, generic, titan = load_stack("megatron-core"), load_stack("generic"), load_stack("torchtitan")
    assert (mc.pp_p2p_overlap, generic.pp_p2p_overlap, titan.pp_p2p_overlap) == ("interleaved", "none", "none")
    assert mc.gemm_efficiency == generic.gemm_efficiency and mc.replicated_state == generic.replicated_state
    zero1 = load_stack("megatron-core-zero1")
    assert zero1.pp_p2p_overlap == "interleaved"
    assert zero1.replicated_state == load_stack("generic-zero1").replicated_state


@pytest.mark.parametrize("framework", ["Megatron-LM", "megatron_core", "Megatron-Bridge", "NeMo"])
def test_megatron_rows_are_predicted_with_megatron_core(framework):
    assert row_stack({"framework": framework, "source": ""}) == "megatron-core"
    assert row_stack({"framework": framework, "source": "", "notes": "--use-distributed-optimizer"}) \
        == "megatron-core-zero1"


def test_interleaved_transfers_hide_behind_a_chunks_compute():
    """vpp 2 on 4 stages: generic (torchtitan's terms) pays half of every chunk's send / receive and a schedule step
    of 4 ms; Megatron-Core's overlapped transfers (~2 ms over NVLink for a 4k-token microbatch) and step fit inside
    the chunk's compute, so nothing shows. The rest of the step is the same."""
    inter = dict(pp_schedule="Interleaved1F1B", vpp=2)
    generic, mc = _p2p("generic", **inter), _p2p("megatron-core", **inter)
    assert generic["breakdown_s"]["pp_p2p"] > 0.25 and mc["breakdown_s"]["pp_p2p"] == 0.0
    rest = {k: v for k, v in generic["breakdown_s"].items() if k not in ("pp_p2p",)}
    assert rest == {k: v for k, v in mc["breakdown_s"].items() if k not in ("pp_p2p",)}
    assert mc["step_time_s"] == pytest.approx(generic["step_time_s"] - generic["breakdown_s"]["pp_p2p"], rel=1e-9)


def test_without_virtual_stages_megatron_waits_on_its_transfers_as_torchtitan_does():
    """Megatron forces overlap_p2p_comm off without virtual stages (batch_p2p_comm): 1F1B and GPipe keep the
    stack's exposed share and schedule step."""
    for schedule in ("1F1B", "GPipe"):
        assert _p2p("megatron-core", pp_schedule=schedule)["breakdown_s"]["pp_p2p"] \
            == _p2p("generic", pp_schedule=schedule)["breakdown_s"]["pp_p2p"] > 0


def test_a_transfer_longer_than_the_chunk_shows_what_outlasts_it():
    """Each of the 32 x 2 chunk-microbatches shows max(0, transfer + schedule step - chunk compute): nothing behind a
    long chunk, all but the chunk's length behind a short one, never more than the transfer and step whole."""
    cfg = TrainConfig(gpus=64, tp=8, pp=4, dp_shard=2, vpp=2, pp_schedule="Interleaved1F1B", seq_len=4096,
                      global_batch_size=64, micro_batch_size=1)
    lay = layout_of(ConfigArrays.single(cfg.resolve(L70, H100)))
    mc, h = load_stack("megatron-core"), float(L70.hidden)
    whole = float(pipeline.p2p_s(lay, H100, mc.model_copy(update={"pp_p2p_overlap": "none", "pp_p2p_exposed": 1.0}),
                                 h, 8.0, microbatch_s=1.0))  # none: every chunk shows its whole transfer
    chunks = 32 * 2
    assert float(pipeline.p2p_s(lay, H100, mc, h, 8.0, microbatch_s=1.0)) == 0.0
    assert float(pipeline.p2p_s(lay, H100, mc, h, 8.0, microbatch_s=0.0)) == pytest.approx(whole)
    short = 2 * 0.5 * whole / chunks  # a microbatch of two chunks, each half as long as its transfer and step
    assert float(pipeline.p2p_s(lay, H100, mc, h, 8.0, microbatch_s=short)) == pytest.approx(whole / 2)


def _stage_allocated(stack: str, global_batch_size: int) -> list[float]:
    cfg = TrainConfig(gpus=64, tp=8, pp=4, dp_shard=2, seq_len=4096, global_batch_size=global_batch_size,
                      micro_batch_size=1)
    return [s["allocated_gib"] for s in estimate(L70, H100, cfg, load_stack(stack))["memory"]["per_stage"]]


def test_receive_buffers_torch_keeps_every_microbatchs_megatron_and_nanotron_only_those_in_flight():
    """A receive buffer is 1 x 4,096 tokens / tp 8 (sequence parallel) x 8,192 x 2 bytes = 8 MiB. torch's
    PipelineStage (torchtitan, generic) keeps one activation and one gradient buffer per microbatch of the step:
    8 -> 64 microbatches (dp 2, global batch 16 -> 128) adds 2 x 56 x 8 MiB = 0.875 GiB on every stage but the
    first. Megatron-Core's and nanotron's P2P allocate each receive as it is posted: 1F1B's microbatches in flight
    (min(m, pp - k) on stage k, 3 on stage 1) hold one, the same at 8 or 64 microbatches; at 8 microbatches stage 1
    holds 16 - 3 = 13 buffers fewer (104 MiB) than under generic."""
    assert (load_stack("nanotron").pp_receive_buffers, load_stack("megatron-core").pp_receive_buffers,
            load_stack("generic").pp_receive_buffers) == ("in_flight", "in_flight", "every_microbatch")
    g8, g64 = _stage_allocated("generic", 16), _stage_allocated("generic", 128)
    assert g8[0] == g64[0]
    # the report rounds to MiB
    assert [b - a for a, b in zip(g8[1:], g64[1:], strict=True)] == pytest.approx([0.875] * 3, abs=2e-3)
    m8, m64 = _stage_allocated("megatron-core", 16), _stage_allocated("megatron-core", 128)
    assert m8 == pytest.approx(m64, abs=1e-12)
    assert g8[1] - m8[1] == pytest.approx(13 * 8 / 1024, abs=2e-3)
    n8, n64 = _stage_allocated("nanotron", 16), _stage_allocated("nanotron", 128)
    assert n8 == pytest.approx(n64, abs=1e-12)
