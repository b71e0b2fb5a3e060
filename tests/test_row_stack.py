"""Which stack profile predicts a row: the framework's release that ran it (dated by its source, its document's
table or its notes), its ZeRO-1 variant, the stack a measured run says it ran as, or the generic profile of a
framework without one; and what a release's profile changes."""

import pytest

from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.run_dates import documented_month, notes_month
from meshplan.estimator.stack import load_stack, source_month, stack_for_run
from meshplan.estimator.validate import predict_row, read_rows, row_stack, validate_rows
from meshplan.estimator.validate_summary import summarize


@pytest.mark.parametrize(
    ("source", "month", "stack"),
    [
        ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 1", "2024-12", "torchtitan-2024"),
        ("pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md", "2025-06", "torchtitan-2025-08"),
        ("a blog post of 2024-11", "2024-11", "torchtitan-2024"),
        ("TorchTitan paper, arXiv:2410.06511 Table 2", "2024-10", "torchtitan-2024"),
        ("https://arxiv.org/abs/2410.06511", "2024-10", "torchtitan-2024"),
        ("PyTorch blog, March 2025", "2025-03", "torchtitan-2024"),  # the loss is compiled from 2025-04-02
        ("PyTorch blog, April 2025", "2025-04", "torchtitan-2025-08"),
        ("pytorch/torchtitan PR #1690, 2025-09", "2025-09", "torchtitan-2025-09"),  # cuDNN attention from 2025-10
        ("pytorch/torchtitan PR #2107, 2025-11", "2025-11", "torchtitan-2026-03"),  # FSDP only where it shards
        ("pytorch/torchtitan PR #3000, 2026-04", "2026-04", "torchtitan-2026-05"),  # FSDP2 on every layout, SDPA
        ("pytorch/torchtitan PR #3900, 2026-07", "2026-07", "torchtitan"),  # FlexAttention from 2026-06-09
        ("pytorch/ao docs/source/workflows/training.md @36027d8", None, "torchtitan"),
        ("", None, "torchtitan"),
    ],
)
def test_a_dated_source_selects_the_release_that_ran_it(source, month, stack):
    assert source_month(source) == month
    assert stack_for_run("torchtitan", month) == stack
    assert stack_for_run("llm-foundry", month) == "llm-foundry"  # one release known


@pytest.mark.parametrize(
    ("notes", "month", "stack"),
    [
        ("memory = max reserved; torch 2.5.1+cu124", "2024-10", "torchtitan-2024"),
        ("pytorch version: 2.7.0a0+gitb98af95, torchtitan version: 0.0.2", "2025-03", "torchtitan-2024"),  # pre-release
        ("torch==2.7.0", "2025-04", "torchtitan-2025-08"),
        ("pytorch version: 2.9.0.dev20250815+cu128", "2025-08", "torchtitan-2025-08"),  # the nightly's own stamp
        ("PyTorch 2.9", "2025-10", "torchtitan-2026-03"),
        ("logged 2024-12-03 at step 100", "2024-12", "torchtitan-2024"),
        ("torch 2.11.0+cu130", None, "torchtitan"),  # newer than the table: the current release
        ("torchtitan 0.0.2; TPS at step 90", None, "torchtitan"),  # torchtitan's own version is not torch's
        ("", None, "torchtitan"),
    ],
)
def test_undated_sources_are_dated_by_what_their_notes_say(notes, month, stack):
    assert notes_month(notes) == month
    row = {"framework": "TorchTitan", "source": "a GitHub issue comment", "hardware": "h100-sxm", "notes": notes}
    assert row_stack(row) == stack
    # the source's own date wins over the notes
    assert row_stack({**row, "source": "benchmarks/llama3_h100_202412_torchtitan.md"}) == "torchtitan-2024"


@pytest.mark.parametrize(
    ("row_id", "stack"),
    [("r0459", "torchtitan-2024"), ("r0462", "torchtitan-2025-08"), ("r0466", "torchtitan-2025-08"),
     ("r0001", "torchtitan-2024"), ("r0041", "torchtitan-2025-08"), ("r0233", "llm-foundry")],
)
def test_an_undated_document_is_dated_per_table_from_its_stated_software(ground_truth, row_id, stack):
    """The torchao float8 table's source names no month; its H100 table ran torchtitan 0.0.2 (March 2025, loss not
    compiled), its MI300X and B200 tables August 2025 (data/provenance/run_dates.yaml). Another document or
    another part is not dated by it."""
    row = next(r for r in read_rows(ground_truth) if r["id"] == row_id)
    assert row_stack(row) == stack
    assert row_stack({**row, "hardware": "h200-sxm"}) == stack_for_run(row["framework"], source_month(row["source"]))
    # its H100 rows as runs.corrections.yaml reads them: the 500 W part
    assert documented_month("pytorch/ao docs/source/workflows/training.md @36027d8", "h100-96g-500w") == "2025-03"
    assert documented_month("another/doc training.md", "h100-96g-500w") is None


def test_release_changes_only_what_it_describes(ground_truth):
    """The late-2024 release did not compile the loss: with compile on, the same row predicts the fp32
    logits buffers (more memory) when dated 2024-12; without compile both releases agree on memory. Its foreach
    AdamW moves 80 bytes a parameter where fused moves 28: the step is longer by that traffic alone."""
    from meshplan.estimator.physics.compute import ADAMW_KERNEL_BYTES, hbm_bytes_per_s

    row = next(r for r in read_rows(ground_truth) if r["id"] == "r0001")  # 8B, mbs 2, compile on
    assert row["compile"] == "true"
    old = predict_row({**row, "source": "benchmarks/llama3_h100_202412_torchtitan.md"})
    new = predict_row({**row, "source": "a 2025-06 benchmark"})
    frag = 1 + load_stack("torchtitan").fragmentation
    assert old[1] - new[1] == pytest.approx(frag * (12 - 4) * 2 * 8192 * 128256 / 2**30, rel=0.01)
    tokens = 2 * 8192  # a rank's tokens a step (mbs 2, one microbatch)
    extra = (ADAMW_KERNEL_BYTES["foreach"] - ADAMW_KERNEL_BYTES["fused"]) * 8.03e9 / 8 / hbm_bytes_per_s(
        load_hardware("h100-96g-500w"))
    assert tokens / old[0] - tokens / new[0] == pytest.approx(extra, rel=0.01)
    eager = {**row, "compile": "false"}
    assert predict_row({**eager, "source": "x_202412_y"})[1] == predict_row({**eager, "source": "x_202506_y"})[1]


def test_stack_profile_extends_a_builtin(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("extends: torchtitan\nid: mine\nname: mine\nfragmentation: 0.2\n")
    s = load_stack(str(own))
    assert s.fragmentation == 0.2 and s.family == "torchtitan"
    assert s.float8 == load_stack("torchtitan").float8
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: nope\nid: bad\n")
    with pytest.raises(MeshplanError, match="unknown stack profile 'nope'"):
        load_stack(str(bad))
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"extends: {b}\nid: a\nname: a\n")
    b.write_text(f"extends: {a}\nid: b\nname: b\n")
    with pytest.raises(MeshplanError, match="extends itself"):
        load_stack(str(a))


def test_a_measured_run_is_predicted_with_the_stack_its_notes_say_it_ran_as():
    """`meshplan compare --append-csv` writes the plan's stack into the notes (the core follows it): validate predicts
    the row with it, whatever the row's date says; a name that is no stack profile is ignored."""
    row = {"framework": "meshplan", "source": "meshplan run x (2026-11-27)", "hardware": "h100-sxm",
           "notes": "10 steps on cuda; ran as stack torchtitan-2026-03 (the core ...)"}
    assert row_stack(row) == "torchtitan-2026-03"
    assert row_stack({**row, "notes": "10 steps on cuda; ran as stack torchtitan-2026-03."}) == "torchtitan-2026-03"
    assert row_stack({**row, "notes": "ran as stack no-such-release"}) == "torchtitan"
    assert row_stack({**row, "notes": ""}) == "torchtitan"


def test_a_framework_without_a_profile_is_predicted_with_the_generic_profile(ground_truth):
    """FSDP rows of an unknown framework are predicted as torchtitan's current release would run them (same
    constants, same memory) but for torchtitan's own per-block FSDP cost: only FSDP2's hooks (~1 ms a block), so
    faster; without FSDP the generic profile keeps the model in bf16 (no fp32 fallback for TP / PP, no autocast)."""
    rows = [r for r in read_rows(ground_truth) if r["id"] in ("r0041", "r0000")]
    other = [{**r, "framework": "deepspeed"} for r in rows]
    got = validate_rows(other)
    assert [r.error for r in got] == [None, None]
    assert [r.stack for r in got] == ["generic", "generic"]
    for mine, titan in zip([predict_row(r) for r in other], [predict_row(r, "torchtitan") for r in rows], strict=True):
        assert mine[1] == titan[1] and 1.05 < mine[0] / titan[0] < 1.4
    assert summarize(got)["by_framework"]["deepspeed"]["rows"] == 2
    # 8 x TP 8, no FSDP: torchtitan 0.2.2 trained it in fp32; the generic profile and nanotron in bf16, as torchtitan
    # does since 2026-04 through FSDP2 on one shard (slower than generic: the one-rank path's parameter and gradient
    # copies every microbatch, its hooks' CPU time on top of eager DTensor launches, DTensor's sequence-parallel copies)
    # (AC none: with torchtitan's op-level SAC in eager mode such a step waits on its CPU, which is not the point here)
    tp8 = {**rows[0], "dp_shard": "1", "tp": "8", "global_batch_size": "8", "micro_batch_size": "1", "ac": "none"}
    old, generic = predict_row(tp8, "torchtitan-2026-03"), predict_row({**tp8, "framework": "deepspeed"})
    assert generic[0] > 3 * old[0] and generic[1] < old[1]
    titan = predict_row(tp8, "torchtitan")
    assert 0.7 < titan[0] / generic[0] < 0.95


@pytest.mark.parametrize("notes,stack", [("ZeRO-1, DP 4", "nanotron-zero1"), ("zero_stage=1", "nanotron-zero1"),
                                         ("zero stage 1", "nanotron-zero1"), ("ZeRO-0", "nanotron"), ("", "nanotron")])
def test_a_zero1_note_picks_the_frameworks_zero1_profile(notes, stack):
    assert row_stack({"framework": "nanotron", "notes": notes, "source": "x"}) == stack
    assert row_stack({"framework": "torchtitan", "notes": notes, "source": "x"}) == "torchtitan"


@pytest.mark.parametrize(("framework", "stack"), [
    ("TorchTitan", "torchtitan"), ("pytorch/torchtitan", "torchtitan"), ("Nanotron", "nanotron"),
    ("llm_foundry", "llm-foundry"), ("LLM Foundry", "llm-foundry"), ("Megatron-LM", "megatron-core"),
    ("megatron-bridge", "megatron-core"), ("NeMo", "megatron-core"), ("nemo-automodel", "generic"), ("DeepSpeed", "generic"),
])
def test_a_framework_as_a_log_spells_it_finds_its_profile(framework, stack):
    assert row_stack({"framework": framework, "source": ""}) == stack
