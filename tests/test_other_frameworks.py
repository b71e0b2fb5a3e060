"""Rows other frameworks write: their pipeline schedule names, and tied embeddings split by TP or PP (Megatron-LM and
nanotron run them; torchtitan refuses them). `meshplan validate` predicts such rows instead of refusing them."""

from __future__ import annotations

import csv
import json

import pytest

from meshplan.estimator.config import TrainConfig
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import load_model
from meshplan.estimator.report import estimate
from meshplan.estimator.stack import load_stack
from meshplan.estimator.validate import ac_name, pp_schedule_name, run_status, validate_rows

H100 = load_hardware("h100-sxm")
# a Llama 3.2 1B-like model: 16 layers, tied embeddings
TIED = load_model("llama3-8b").model_copy(update={
    "layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "ffn_hidden": 8192, "tied_embeddings": True,
    "name": "tied-1b"})
UNTIED = TIED.model_copy(update={"tied_embeddings": False, "name": "untied-1b"})


@pytest.mark.parametrize(("cell", "name"), [
    ("", "1F1B"), ("1F1B", "1F1B"), ("1f1b", "1F1B"), ("afab", "GPipe"), ("AllForwardAllBackward", "GPipe"),
    ("all_forward_all_backward", "GPipe"), ("ScheduleGPipe", "GPipe"), ("Schedule1F1B", "1F1B"),
    ("ScheduleInterleaved1F1B", "Interleaved1F1B"), ("interleaved_1f1b", "Interleaved1F1B"), ("zero-bubble", "zero-bubble"),
])
def test_schedule_names_of_other_frameworks(cell, name):
    assert pp_schedule_name(cell) == name


@pytest.mark.parametrize(("cell", "status"), [
    ("ok", "ok"), ("OK", "ok"), ("success", "ok"), ("Completed", "ok"), ("oom", "oom"), ("OOM", "oom"),
    ("CUDA out of memory", "oom"), ("OutOfMemoryError", "oom"), ("timeout", "timeout"), ("", ""),
])
def test_status_words_of_sweeps(cell, status):
    """A sweep's status in its own words counts as ok / oom for the fit agreement; others are not judged."""
    assert run_status(cell) == status


def _row(**over) -> dict:
    row = dict(id="x", source="a sweep", framework="nanotron", model="Llama 1B", layers="16", hidden="2048",
               heads="32", kv_heads="8", ffn_hidden="8192", vocab="128256", tied_embeddings="true", mlp="swiglu",
               seq_len="4096", hardware="h100-sxm", gpus="8", gpus_per_node="8", dp_replicate="2", dp_shard="1",
               tp="1", pp="4", pp_schedule="afab", vpp="", cp="1", global_batch_size="64", micro_batch_size="1",
               precision="bf16", float8_recipe="", compile="", ac="none", async_tp="false",
               measured_tps_per_gpu="", measured_mem_gib="", measured_mfu="", status="ok", notes="")
    row.update(over)
    return row


def test_a_nanotron_sweep_row_with_tied_embeddings_and_pp_is_predicted():
    rows = [_row(), _row(pp="1", tp="4", pp_schedule="", dp_replicate="2"), _row(pp_schedule="1f1b"),
            _row(pp_schedule="zero-bubble")]
    got = validate_rows(rows)
    assert [r.error for r in got[:3]] == [None, None, None]
    assert all(r.predicted_tps_per_gpu > 0 and r.predicted_mem_gib > 0 for r in got[:3])
    assert "pp_schedule 'zero-bubble'" in got[3].error  # an unknown name: one line naming the field and the value
    # the same rows under torchtitan: refused, as torchtitan refuses them
    titan = validate_rows([{**r, "framework": "torchtitan"} for r in rows[:2]])
    assert all("ties its input and output embeddings" in r.error for r in titan)


def test_tied_embeddings_split_by_a_pipeline_keep_a_copy_on_the_last_stage():
    """With pp > 1 the first stage holds the embedding and the last its own copy of the shared weight: the worst
    rank's memory is the untied model's. Without a pipeline the weight is held once: less than untied."""
    generic = load_stack("generic")
    pp = TrainConfig(gpus=8, pp=4, dp_shard=2, seq_len=4096, global_batch_size=16)
    assert estimate(TIED, H100, pp, generic)["memory"]["peak_gib"] == pytest.approx(
        estimate(UNTIED, H100, pp, generic)["memory"]["peak_gib"], rel=1e-9)
    tp = TrainConfig(gpus=8, tp=4, dp_shard=2, seq_len=4096, global_batch_size=16)
    assert estimate(TIED, H100, tp, generic)["memory"]["peak_gib"] < estimate(UNTIED, H100, tp, generic)["memory"]["peak_gib"]
    with pytest.raises(MeshplanError, match="ties its input and output embeddings"):
        estimate(TIED, H100, tp, load_stack("torchtitan"))


def test_validate_cli_reads_a_sweep_with_other_names(tmp_path, cli):
    path = tmp_path / "sweep.csv"
    rows = [_row(id="a", status="success"),
            _row(id="b", pp_schedule="AllForwardAllBackward", status="OOM", global_batch_size="512")]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = cli("validate", str(path), "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert [r["error"] for r in got["rows"]] == [None, None]
    assert [r["stack"] for r in got["rows"]] == ["nanotron", "nanotron"]
    assert [r["status"] for r in got["rows"]] == ["ok", "oom"]
    assert got["summary"]["all"]["fit_agreement"]["rows"] == 2


def test_the_planner_does_not_rank_what_the_core_refuses_whatever_stack_it_estimates_with():
    """The generic stack predicts a tied model under TP (Megatron runs it), but the plans meshplan ranks run on its
    own core, which refuses it: none is ranked, and the best plan writes as a plan file."""
    from meshplan.planner.plan_file import make_plan
    from meshplan.planner.search import plan_search

    mpt = load_model("mpt-7b")
    assert mpt.tied_embeddings
    res = plan_search(mpt, H100, load_stack("generic"), 8, 8, 2048, 32)
    ranked = [res.config(int(i)) for i in res.ranked]
    assert ranked and all(c["tp"] == 1 and c["pp"] == 1 for c in ranked)
    best = {k: v for k, v in ranked[0].items() if k in TrainConfig.model_fields}
    assert make_plan(mpt, "mpt-7b", H100, TrainConfig(**best), estimate=None, steps=10, stack="generic").name


@pytest.mark.parametrize(("tp", "gib"), [(1, 4.892), (2, 2.446)])
def test_nanotrons_loss_holds_ten_bytes_a_logit_on_its_vocab_shard(tp, gib):
    """nanotron's sharded_cross_entropy(dtype=float) keeps the bf16 logits, their fp32 copy and the max-shifted fp32
    softmax at once (2 + 4 + 4 bytes), always on the TP rank's vocabulary shard: 4096 tokens x 128256 / tp x 10 B."""
    cfg = TrainConfig(gpus=8, dp_replicate=8 // tp, dp_shard=1, tp=tp, seq_len=4096, global_batch_size=64,
                      micro_batch_size=1, ac="none")
    est = estimate(TIED, H100, cfg, load_stack("nanotron"))
    assert est["memory"]["breakdown_gib"]["logits_loss"] == pytest.approx(gib, abs=0.002)


def test_nanotron_all_reduces_gradients_once_per_step_under_accumulation():
    """nanotron's pipeline engine keeps DDP from syncing until the last microbatch's backward: 32 microbatches
    all-reduce as much as one. torchtitan's DDP reduces on every backward: 32 times as much."""
    def allreduce(stack, gbs):
        cfg = TrainConfig(gpus=8, dp_replicate=8, dp_shard=1, seq_len=4096, global_batch_size=gbs,
                          micro_batch_size=1, ac="full")
        t = estimate(TIED, H100, cfg, load_stack(stack))["throughput"]
        assert t["microbatches"] == gbs // 8
        return t["breakdown_s"]["dp_allreduce"]

    assert allreduce("nanotron", 256) == pytest.approx(allreduce("nanotron", 8), rel=1e-3)  # rounded to 0.1 ms
    assert allreduce("torchtitan", 256) == pytest.approx(32 * allreduce("torchtitan", 8), rel=1e-2)
    assert allreduce("nanotron", 8) > 0


@pytest.mark.parametrize(("cell", "mode"), [
    ("", "none"), ("none", "none"), ("False", "none"), ("no", "none"), ("true", "full"), ("recompute_layer", "full"),
    ("full", "full"), ("Full", "full"), ("full_recompute", "full"), ("selective", "selective"), ("op", "selective"),
    ("selective-op", "selective"), ("weird", "weird"),
])
def test_activation_checkpointing_in_other_frameworks_words(cell, mode):
    """nanotron's recompute_layer is a bool, Megatron-LM's granularity full / selective: read as meshplan's modes; an
    unknown word is kept for the row's one-line error."""
    assert ac_name(cell) == mode


def test_a_sweeps_rounded_batch_and_recompute_flag_are_predicted():
    """A sweep that states a target batch its framework rounded to whole accumulation steps (250 sequences on dp 4 x
    micro-batch 3: 21 steps, 252) and nanotron's recompute_layer flag is predicted, as the row it ran is."""
    got = validate_rows([_row(gpus="16", dp_replicate="4", tp="2", pp="2", pp_schedule="1f1b",
                              global_batch_size=gbs, micro_batch_size="3", ac=ac)
                         for gbs, ac in (("250", "true"), ("252", "full"), ("252", "weird"))])
    assert got[0].error is None and got[1].error is None
    assert got[0].predicted_tps_per_gpu == got[1].predicted_tps_per_gpu
    assert got[0].predicted_mem_gib == got[1].predicted_mem_gib
    assert "ac 'weird'" in got[2].error and "'full'" in got[2].error


def test_a_logs_spellings_of_precision_booleans_and_activation_are_read():
    """Float8 in any spelling is fp8 (tensorwise unless the recipe says otherwise); yes / no columns take on / off and
    enabled / disabled; Llama's gated SiLU named by its activation is swiglu; a cell that is no boolean is one line
    that names the row and the column."""
    rows = [_row(precision=p, compile=c, mlp=m, pp="1", pp_schedule="", dp_replicate="8")
            for p, c, m in (("fp8", "true", "swiglu"), ("Float8", "on", "silu"), ("FP8_E4M3", "enabled", "SwiGLU"),
                            ("bf16", "true", "swiglu"), ("bf16", "maybe", "swiglu"))]
    got = validate_rows(rows)
    assert [r.error for r in got[:4]] == [None] * 4
    assert got[0].predicted_tps_per_gpu == got[1].predicted_tps_per_gpu == got[2].predicted_tps_per_gpu
    assert got[0].predicted_tps_per_gpu != got[3].predicted_tps_per_gpu  # fp8 is not bf16
    assert got[4].error == "row x: column 'compile' is not true or false: 'maybe'"


def test_a_nanotron_rows_data_parallel_ranks_are_replicas_however_the_row_splits_them():
    """nanotron has no FSDP (`fsdp: none`): dp 4 written as dp_shard, inferred, or split 2 x 2 is the same 4 DDP
    replicas; torchtitan's profile reads dp_shard as FSDP (sharded state: less memory)."""
    splits = [dict(dp_replicate="4", dp_shard="1"), dict(dp_replicate="1", dp_shard="4"),
              dict(dp_replicate="1", dp_shard="-1"), dict(dp_replicate="2", dp_shard="2")]
    got = validate_rows([_row(gpus="16", tp="2", pp="2", pp_schedule="1f1b", global_batch_size="256", **s)
                         for s in splits])
    assert [r.error for r in got] == [None] * 4
    assert len({(r.predicted_tps_per_gpu, r.predicted_mem_gib) for r in got}) == 1
    fsdp = validate_rows([_row(framework="generic", gpus="16", tp="1", pp="1", pp_schedule="", tied_embeddings="false",
                               global_batch_size="256", dp_replicate=r, dp_shard=d) for r, d in (("16", "1"), ("1", "16"))])
    assert [r.error for r in fsdp] == [None, None] and fsdp[1].predicted_mem_gib < fsdp[0].predicted_mem_gib


def test_generic_ddp_all_reduces_once_per_step_and_its_fsdp_every_microbatch():
    """A framework without a profile (Megatron-LM, DeepSpeed: `generic`) runs DDP's all-reduce in the last
    microbatch's backward only (replicate_sync_every_microbatch false); under HSDP FSDP2 still reduces every
    microbatch, as torchtitan does."""
    def allreduce(stack, gbs, **kw):
        cfg = TrainConfig(gpus=8, seq_len=4096, global_batch_size=gbs, micro_batch_size=1, ac="full", **kw)
        return estimate(UNTIED, H100, cfg, load_stack(stack))["throughput"]["breakdown_s"]["dp_allreduce"]

    ddp = dict(dp_replicate=8, dp_shard=1)
    assert allreduce("generic", 256, **ddp) == pytest.approx(allreduce("generic", 8, **ddp), rel=1e-3)
    hsdp = dict(dp_replicate=2, dp_shard=4)
    assert allreduce("generic", 256, **hsdp) == pytest.approx(4 * allreduce("generic", 64, **hsdp), rel=1e-2)


M8, H100_ = load_model("llama3-8b"), load_hardware("h100-sxm")
DIMENSIONS = dict.fromkeys(("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "tied_embeddings"), "")


@pytest.mark.parametrize("name", ["Llama 3.1 8B", "llama3-8b", "meta-llama/Meta-Llama-3.1-8B", "Meta-Llama-3-8B",
                                  "Llama-3-8B"])
def test_a_row_naming_a_preset_without_dimensions_is_predicted_as_the_preset(name):
    """A team's own log names its model and leaves the dimensions out: the preset it names is used, as if its
    dimensions were written out (the Llama 3 name too: Llama 3 and 3.1 share their dimensions)."""
    written = _row(framework="torchtitan", model="Llama 3.1 8B", layers="32", hidden="4096", heads="32",
                   kv_heads="8", ffn_hidden="14336", tied_embeddings="false", dp_replicate="1", dp_shard="8",
                   pp="1", pp_schedule="", global_batch_size="8")
    named = {**written, **DIMENSIONS, "model": name}
    got, want = validate_rows([named, written])
    assert got.error is None and got.predicted_tps_per_gpu == pytest.approx(want.predicted_tps_per_gpu)
    assert got.predicted_mem_gib == pytest.approx(want.predicted_mem_gib)


def test_a_moe_preset_by_name_keeps_its_experts():
    row = _row(framework="torchtitan", model="Qwen/Qwen3-30B-A3B", **DIMENSIONS, dp_replicate="1", dp_shard="8",
               pp="1", pp_schedule="", global_batch_size="8", ep="8")
    dense = {**row, "model": "Qwen3 dense", "layers": "48", "hidden": "2048", "heads": "32", "kv_heads": "4",
             "ffn_hidden": "6144", "vocab": "151936", "tied_embeddings": "false", "ep": "1"}
    got, without_experts = validate_rows([row, dense])
    assert got.error is None and got.predicted_tps_per_gpu > 0
    # 128 experts of which 8 run: far more memory than the dense model of the same width, and faster per token
    assert got.predicted_mem_gib > 2 * without_experts.predicted_mem_gib


def test_a_row_without_dimensions_naming_no_preset_is_one_line():
    (got,) = validate_rows([{**_row(), **DIMENSIONS, "model": "My 7B"}])
    assert got.error.startswith("row x: no model dimensions and model 'My 7B' is no preset: fill layers")
    assert "\n" not in got.error
    (partial,) = validate_rows([{**_row(), "vocab": ""}])  # some dimensions given: the empty one is named
    assert "vocab" in partial.error


def test_async_tp_runs_eager_where_the_framework_overlaps_its_own_tp_collectives():
    """nanotron's tp_linear_async_communication and Megatron-LM's tp_comm_overlap need no torch.compile; torchtitan's
    async TP is an inductor pass and refuses an eager run."""
    vanilla, overlapped = validate_rows([_row(tp="4", pp="1", pp_schedule="", tied_embeddings="false", async_tp=a)
                                         for a in ("false", "true")])
    assert vanilla.error is None and overlapped.error is None
    assert overlapped.predicted_tps_per_gpu > vanilla.predicted_tps_per_gpu
    (megatron,) = validate_rows([_row(framework="megatron", tp="4", pp="1", pp_schedule="", async_tp="true")])
    assert megatron.error is None and megatron.stack == "megatron-core"
    (titan,) = validate_rows([_row(framework="torchtitan", tp="4", pp="1", pp_schedule="", tied_embeddings="false",
                                   async_tp="true")])
    assert titan.error == "row x: async TP is a torch.compile pass: it needs compile on, with model in compile_components"


def test_a_vocabulary_tp_does_not_divide_is_padded_where_the_framework_pads_it():
    """GPT-2's 50,257 tokens over tp 4: Megatron-LM and nanotron pad the vocabulary to a multiple of tp; torchtitan
    refuses."""
    nano, megatron, titan = validate_rows([
        _row(tp="4", pp="1", pp_schedule="", tied_embeddings="false", vocab="50257"),
        _row(framework="Megatron-LM", tp="4", pp="1", pp_schedule="", vocab="50257"),
        _row(framework="torchtitan", tp="4", pp="1", pp_schedule="", tied_embeddings="false", vocab="50257")])
    assert nano.error is None and megatron.error is None and nano.predicted_mem_gib > 0
    assert titan.error == "row x: tp 4 does not divide the vocabulary (50257), which loss parallel shards"


def test_virtual_stages_torchtitan_cannot_count_run_where_the_framework_splits_them_itself():
    """Megatron-LM runs 80 layers on pp 4 x vpp 5 (4 layers a virtual stage); torchtitan's layers_per_stage gives
    no split into 20 stages of 80 layers + embedding + output, and refuses."""
    shape = dict(layers="80", hidden="8192", heads="64", kv_heads="8", ffn_hidden="28672", tied_embeddings="false",
                 gpus="64", tp="4", pp="4", vpp="5", pp_schedule="Interleaved1F1B", dp_replicate="4",
                 global_batch_size="64")
    megatron, titan = validate_rows([_row(framework="megatron", **shape), _row(framework="torchtitan", **shape)])
    assert megatron.error is None and megatron.predicted_tps_per_gpu > 0
    assert "torchtitan cannot split the 80 layers" in titan.error


def test_megatron_distributed_optimizer_shards_master_weights_and_moments_over_replicas():
    """Megatron-LM's --use-distributed-optimizer (ZeRO-1): megatron-core-zero1 when the notes say so (generic-zero1
    for a framework without a profile); the fp32 master copy (4 bytes a parameter) and AdamW's moments (8) divide
    over the 8 replicas, the bf16 weights (2) and the fp32 grad buffer (4) do not."""
    ddp = _row(framework="Megatron-LM", model="Llama 1B", tp="1", pp="1", pp_schedule="", dp_replicate="8",
               tied_embeddings="false")
    plain, sharded = validate_rows([ddp, {**ddp, "notes": "--use-distributed-optimizer"}])
    assert (plain.stack, sharded.stack) == ("megatron-core", "megatron-core-zero1")
    (deepspeed,) = validate_rows([{**ddp, "framework": "DeepSpeed", "notes": "ZeRO stage 1"}])
    assert deepspeed.stack == "generic-zero1"
    assert deepspeed.predicted_mem_gib == pytest.approx(sharded.predicted_mem_gib)
    assert sharded.predicted_mem_gib < plain.predicted_mem_gib
    cfg = TrainConfig(gpus=8, dp_replicate=8, dp_shard=1, seq_len=4096, global_batch_size=8)
    full, zero = (estimate(M8, H100_, cfg, load_stack(s))["memory"]["breakdown_gib"] for s in ("generic", "generic-zero1"))
    assert zero["params_fp32"] == pytest.approx(full["params_fp32"] * (2 + 4 / 8) / 6, rel=1e-3)
    assert zero["optimizer_states"] == pytest.approx(full["optimizer_states"] / 8, rel=1e-3)
    assert zero["grads_fp32"] == pytest.approx(full["grads_fp32"])


def _kf(stack: str, **kw) -> dict:
    base = dict(gpus=32, gpus_per_node=4, seq_len=4096, global_batch_size=128, micro_batch_size=1, ac="full")
    base.update(kw)
    return estimate(M8, load_hardware("h200-sxm"), TrainConfig(**base), load_stack(stack))


def test_fsdp_without_a_reduce_scatter_before_the_last_microbatch_keeps_every_unsharded_gradient():
    """KempnerForge accumulates with FSDP2's set_requires_gradient_sync(False): each parameter's unsharded gradient
    stays, in the fp32 reduce dtype, until the last microbatch (FSDPParam.to_accumulated_grad_if_needed), and the
    reduce-scatter runs once a step. torchtitan reduce-scatters every microbatch and holds a block's at most."""
    gib = 2**30
    kf, tt = _kf("kempnerforge"), _kf("generic")
    held = kf["memory"]["breakdown_gib"]["unsharded_grads"] - tt["memory"]["breakdown_gib"]["unsharded_grads"]
    assert held == pytest.approx(4 * M8.params / gib, rel=0.05)  # every parameter's fp32 gradient
    one = _kf("kempnerforge", global_batch_size=32)  # one microbatch: nothing accumulates
    assert one["memory"]["breakdown_gib"]["unsharded_grads"] < 0.1 * held
    # the reduce-scatter once a step: less FSDP traffic exposed than reducing all 4 microbatches
    assert kf["throughput"]["breakdown_s"]["fsdp_exposed"] < tt["throughput"]["breakdown_s"]["fsdp_exposed"]


def test_a_stack_that_reshards_under_pp_gathers_every_microbatch_and_keeps_one_block():
    """KempnerForge's pipeline path wraps FSDP2 with its default reshard_after_forward=True
    (`pp_reshard_after_forward`): each microbatch gathers every block forward and backward; torchtitan keeps the
    stage's parameters gathered for the step."""
    kw = dict(dp_shard=4, tp=4, pp=2, global_batch_size=32, micro_batch_size=1)
    kf = _kf("kempnerforge", **kw)
    keep = load_stack("kempnerforge").model_copy(update={"pp_reshard_after_forward": False})
    kept = estimate(M8, load_hardware("h200-sxm"), TrainConfig(gpus=32, gpus_per_node=4, seq_len=4096, ac="full",
                                                                **kw), keep)
    assert kf["memory"]["breakdown_gib"]["unsharded_params"] < 0.5 * kept["memory"]["breakdown_gib"][
        "unsharded_params"]
    assert kf["throughput"]["step_time_s"] > kept["throughput"]["step_time_s"]


def test_a_whole_model_compiled_without_fsdp_holds_a_second_gradient_copy_under_accumulation():
    """KempnerForge compiles the whole model in one graph (`compile_whole_model`): its backward returns every gradient
    at once, so from the second microbatch on the end of the backward holds the accumulated gradients and the new
    ones (measured on one H100: 2.02 GiB above the weights of a 1 GiB model, against 1.45 eager or compiled a block
    at a time). Not with one microbatch, not eager, not under FSDP (its hooks split the graph), not for torchtitan."""
    gib = 2**30
    hw = load_hardware("h200-sxm")

    kf = load_stack("kempnerforge")
    per_block = kf.model_copy(update={"compile_whole_model": False})

    def memory(stack, **kw) -> dict:
        cfg = dict(gpus=1, seq_len=4096, global_batch_size=8, micro_batch_size=2, ac="full", dtype="bfloat16",
                   compile=True)
        return estimate(M8, hw, TrainConfig(**{**cfg, **kw}), stack)["memory"]

    whole, split = memory(kf), memory(per_block)
    assert whole["peak_phase"] == "end of backward"
    assert whole["breakdown_gib"]["transient"] == pytest.approx(2 * M8.params / gib, rel=0.01)  # bf16 gradients
    assert whole["allocated_gib"] > split["allocated_gib"]  # the peak moves there
    # one microbatch, eager, FSDP 2: the same as compiled a block at a time
    for kw in ({"global_batch_size": 2}, {"compile": False}, {"gpus": 2, "gpus_per_node": 2, "global_batch_size": 16}):
        assert memory(kf, **kw)["allocated_gib"] == pytest.approx(memory(per_block, **kw)["allocated_gib"]), kw
    assert not load_stack("torchtitan").compile_whole_model


def _traced_loss_bytes_per_logit(keep_logits: bool) -> float:
    """Peak live bytes a logit of F.cross_entropy on bf16 logits, forward + backward, traced by torch's MemTracker on
    fake tensors (no kernel runs: what the tensors the ops return hold), beyond the head's weight and input and their
    gradients; `keep_logits`: the loop still references the logits during backward."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    n, h, v = 4096, 64, 65536
    with FakeTensorMode():
        head = nn.Linear(h, v, bias=False, dtype=torch.bfloat16)
        x = torch.randn(n, h, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, v, (n,))
        mt = MemTracker()
        mt.track_external(head, x)
        with mt:
            logits = head(x)
            loss = F.cross_entropy(logits.view(-1, v), labels)
            if not keep_logits:
                del logits
            loss.backward()
        peak = sum(c["Total"] for c in mt.get_tracker_snapshot("peak").values())
    return (peak - 2 * 2 * (h * v + n * h)) / (n * v)


def test_kempnerforges_loss_bytes_are_what_its_eager_loss_holds():
    """KempnerForge compiles the model, not the loss (training/loss.py runs eagerly), and its loop keeps `logits`
    referenced through backward: the logits, their bf16 log-softmax, nll's gradient and log-softmax's gradient are
    live together, 8 bytes a logit as traced; 6 where a loop frees the logits before backward."""
    kept, freed = _traced_loss_bytes_per_logit(True), _traced_loss_bytes_per_logit(False)
    assert kept == pytest.approx(8, abs=0.1) and freed == pytest.approx(6, abs=0.1)
    kf = load_stack("kempnerforge")
    assert kf.logits_bytes_per_element == round(kept) and kf.compiled_loss_bytes_per_element is None
    compiled = _kf("kempnerforge", gpus=4, dp_shard=1, tp=4, global_batch_size=8, micro_batch_size=4)["memory"]
    logits = 4 * 4096 * M8.vocab  # every TP rank holds the whole vocabulary's logits (no loss parallel)
    assert compiled["breakdown_gib"]["logits_loss"] == pytest.approx(8 * logits / 2**30, rel=0.01)


def test_bf16_training_without_fsdp_keeps_two_byte_weights_whatever_the_stack_keeps_in_mixed_precision():
    """training.dtype bfloat16 (precision bf16-pure): weights, gradients and moments in bf16, no master copy. A
    stack whose mixed-precision weights are bf16 already (generic, nanotron) keeps them at 2 bytes, not 1."""
    gib = 2**30
    for stack in ("generic", "nanotron", "torchtitan"):
        est = estimate(M8, load_hardware("h200-sxm"), TrainConfig(gpus=1, seq_len=2048, global_batch_size=1,
                                                                   ac="full", dtype="bfloat16"),
                       load_stack(stack))
        b = est["memory"]["breakdown_gib"]
        assert b["params_fp32"] == pytest.approx(2 * M8.params / gib, rel=0.01), stack
        assert b["optimizer_states"] == pytest.approx(4 * M8.params / gib, rel=0.01), stack


def test_a_kempnerforge_row_is_predicted_with_its_own_profile():
    row = _row(framework="KempnerForge", model="KempnerForge 7B", layers="32", hidden="4096", heads="32",
               kv_heads="8", ffn_hidden="14336", tied_embeddings="false", hardware="h200-sxm", gpus="32",
               gpus_per_node="4", dp_replicate="1", dp_shard="32", tp="1", pp="1", pp_schedule="",
               global_batch_size="512", micro_batch_size="4", precision="bf16-pure", ac="full")
    (got,) = validate_rows([row])
    assert got.error is None and got.stack == "kempnerforge"


def test_a_stack_that_keeps_the_embedding_whole_under_tp_holds_all_of_it_on_every_rank():
    """KempnerForge leaves the token embedding replicated under TP (`tp_shards_embedding` false): each TP rank holds
    the whole embedding with its gradient and moments; torchtitan shards it over the TP ranks."""
    gib = 2**30
    cfg = TrainConfig(gpus=4, gpus_per_node=4, tp=4, seq_len=4096, global_batch_size=8, micro_batch_size=4,
                      ac="full", dtype="bfloat16")
    kf = load_stack("kempnerforge")
    whole = estimate(M8, load_hardware("h200-sxm"), cfg, kf)["memory"]["breakdown_gib"]
    sharded = estimate(M8, load_hardware("h200-sxm"), cfg, kf.model_copy(update={"tp_shards_embedding": True}))[
        "memory"]["breakdown_gib"]
    extra = M8.embedding_params * (1 - 1 / 4) / gib
    assert whole["params_fp32"] - sharded["params_fp32"] == pytest.approx(2 * extra, rel=0.02)  # bf16 weights
    assert whole["optimizer_states"] - sharded["optimizer_states"] == pytest.approx(4 * extra, rel=0.02)


def test_tp_without_sequence_parallelism_on_pipeline_stages():
    """KempnerForge's apply_tensor_parallel turns sequence parallelism off on a pipeline stage (seq_parallel = not
    is_pp_stage and ...): its TP ranks keep each block's input whole, hold the whole output head, send whole-sequence
    activations between stages and copy no sequence-parallel layouts. Without PP it keeps sequence parallelism."""
    from meshplan.estimator.arrays import ConfigArrays
    from meshplan.estimator.physics import activations, comms, pipeline, shapes
    from meshplan.estimator.physics.layout import layout_of, sequence_shards

    kf = load_stack("kempnerforge")
    with_sp = kf.model_copy(update={"tp_sequence_parallel_off_for": []})
    hw = load_hardware("h200-sxm")

    def lay_of(pp):
        cfg = TrainConfig(gpus=8 * pp, gpus_per_node=4, dp_shard=2, tp=4, pp=pp, global_batch_size=8,
                          micro_batch_size=1, seq_len=4096, ac="full")
        return layout_of(ConfigArrays.single(cfg.resolve(M8, hw)))

    piped, flat = lay_of(2), lay_of(1)
    assert float(sequence_shards(kf, M8, piped)) == 1.0 and float(sequence_shards(kf, M8, flat)) == 4.0
    assert float(sequence_shards(load_stack("torchtitan"), M8, piped)) == 4.0
    h = float(M8.hidden)
    # full AC keeps each block's input: whole (2 h bytes a token), not a quarter of it
    act, _ = activations.saved_per_token_layer(M8, kf, piped)
    act_sp, _ = activations.saved_per_token_layer(M8, with_sp, piped)
    assert (float(act), float(act_sp)) == (2 * h, 2 * h / 4)
    # the whole output head on every TP rank of the last stage
    out = float(shapes.rank_params(M8, piped, False, sequence_shards(kf, M8, piped)).output)
    assert out == pytest.approx(float(M8.output_params), rel=1e-9)
    # the stage-to-stage activation and its receive buffer: the whole sequence
    assert float(pipeline.p2p_s(piped, hw, kf, h, 1.0, 0.1) - pipeline.p2p_s(piped, hw, kf, h, 4.0, 0.1)) > 0
    assert float(pipeline.receive_buffer_bytes(piped, h, False, 1.0)) == 4 * float(
        pipeline.receive_buffer_bytes(piped, h, False, 4.0))
    # eager: no DTensor Shard(1) layout copies (each block all-reduces a replicated activation)
    assert float(comms.tp_times(M8, hw, kf, piped, 16).copy_s) == 0.0
    assert float(comms.tp_times(M8, hw, with_sp, piped, 16).copy_s) > 0.0
    # so a pipelined KempnerForge step is slower than the same stack with sequence parallelism
    cfg = dict(dp_shard=2, tp=4, pp=2, global_batch_size=16, micro_batch_size=1)
    assert _kf("kempnerforge", gpus=16, **cfg)["throughput"]["step_time_s"] > estimate(
        M8, hw, TrainConfig(gpus=16, gpus_per_node=4, seq_len=4096, ac="full", **cfg), with_sp)[
        "throughput"]["step_time_s"]


def test_a_row_measured_on_the_first_stage_is_compared_with_that_stage():
    """KempnerForge logs rank 0's memory: with PP the first stage's, which validate compares with that stage's
    predicted peak, not the worst stage's (torchtitan's "max over PP ranks" rows keep the worst)."""
    from meshplan.estimator.validate import memory_stage

    assert memory_stage("memory is rank 0 (first stage); KempnerForge = ...") == 0
    assert memory_stage("memory = max over PP ranks") is None
    kw = dict(framework="KempnerForge", model="KempnerForge 7B", layers="32", hidden="4096", heads="32",
              kv_heads="8", ffn_hidden="14336", tied_embeddings="false", hardware="h200-sxm", gpus="16",
              gpus_per_node="4", dp_replicate="1", dp_shard="2", tp="4", pp="2", pp_schedule="1F1B",
              global_batch_size="16", micro_batch_size="4", precision="bf16-pure", ac="full",
              measured_mem_gib="30", notes="mem = rank-0 torch.cuda.max_memory_allocated; memory is rank 0 (first stage)")
    first, worst = validate_rows([_row(**kw), _row(**{**kw, "notes": "mem = torch.cuda.max_memory_allocated"})])
    est = estimate(M8, load_hardware("h200-sxm"),
                   TrainConfig(gpus=16, gpus_per_node=4, dp_shard=2, tp=4, pp=2, pp_schedule="1F1B", seq_len=4096,
                               global_batch_size=16, micro_batch_size=4, ac="full", dtype="bfloat16"),
                   load_stack("kempnerforge"))
    stage0 = est["memory"]["per_stage"][0]
    assert est["memory"]["worst_rank"] == "last pipeline stage"
    assert stage0["allocated_gib"] == pytest.approx(stage0["peak_gib"] - stage0["breakdown_gib"]["fragmentation"],
                                                    abs=0.01)
    assert first.predicted_mem_gib == stage0["allocated_gib"]
    assert worst.predicted_mem_gib == pytest.approx(est["memory"]["allocated_gib"], abs=0.01)
    assert first.predicted_mem_gib < worst.predicted_mem_gib
    assert first.as_dict()["mem_stage"] == 0 and "mem_stage" not in worst.as_dict()  # validate --json says which


def test_the_steps_one_reduce_scatter_hides_only_in_the_overlap_its_microbatch_leaves():
    """Without a reduce-scatter before the last microbatch (KempnerForge), that microbatch's backward issues the
    step's whole gradient reduce-scatter beside its own all-gathers: where the two outlast FSDP's overlap of its
    compute, the rest is exposed (a 70B over 8 nodes of 4 H200: ~70 GB of fp32 gradients a rank); where they fit,
    the reduce-scatter is hidden like the per-microbatch collectives (its 1 - fsdp_overlap share exposed)."""
    from meshplan.estimator.arrays import ConfigArrays
    from meshplan.estimator.physics import comms, compute, finetune, shapes
    from meshplan.estimator.physics.layout import layout_of
    from meshplan.estimator.physics.step import step_time

    kf, hw = load_stack("kempnerforge"), load_hardware("h200-sxm-4gpu")
    m70 = load_model("llama3-70b")

    def parts(model, **kw):
        cfg = TrainConfig(**{"gpus": 32, "gpus_per_node": 4, "dp_shard": 8, "tp": 4, "seq_len": 4096,
                             "global_batch_size": 64, "micro_batch_size": 2, "ac": "full", "dtype": "bfloat16", **kw})
        lay = layout_of(ConfigArrays.single(cfg.resolve(model, hw)))
        rp = shapes.rank_params(model, lay, kf.tp_shards_embedding)
        f = comms.fsdp_times(hw, kf, lay, rp, finetune.weights(model, lay, rp))
        busy = compute.compute_times(model, hw, kf, lay, rp.layers, float(model.vocab), rp.moe_layers).busy_s
        st = step_time(model, hw, kf, lay, rp, float(model.vocab))
        return f, float(busy), st

    f, busy, st = parts(m70)
    rs, per_mb, cap = float(f.reduce_once_s), float(f.per_microbatch_s), kf.fsdp_overlap * busy
    assert rs > 0 and float(f.step_once_s) == 0.0
    assert per_mb + rs > cap  # the 70B's gathers and its reduce-scatter outlast the overlap
    exposed_mb = max(0.0, per_mb - cap)
    expected = max(0.0, per_mb + rs - cap) - exposed_mb
    assert expected > rs * (1 - kf.fsdp_overlap)
    # fsdp_exposed = m x (per-microbatch exposed + copy-out) + edges + the reduce-scatter's exposed part
    m = 4
    counted = m * (exposed_mb + float(f.copy_out_s)) + float(f.step_edges_s) + expected
    assert float(st.parts["fsdp_exposed"]) == pytest.approx(counted, rel=1e-6)
    # a model whose collectives fit: its reduce-scatter exposes only the share FSDP's overlap leaves
    f8, busy8, st8 = parts(M8, gpus=8, dp_shard=2, global_batch_size=16, micro_batch_size=4)
    assert float(f8.per_microbatch_s + f8.reduce_once_s) < kf.fsdp_overlap * busy8
    rest = float(st8.parts["fsdp_exposed"]) - 2 * (max(0.0, float(f8.per_microbatch_s) - kf.fsdp_overlap * busy8)
                                                  + float(f8.copy_out_s)) - float(f8.step_edges_s)
    assert rest == pytest.approx(float(f8.reduce_once_s) * (1 - kf.fsdp_overlap), rel=1e-6)
