"""meshplan's torchtitan exports, read by the REAL torchtitan releases 0.2.2 and 0.3.0, compared field by field.

Each release lies in its own folder (`.ci/install-torchtitan.sh`: .engines/torchtitan-0.2.2, .engines/torchtitan-
0.3.0, and triton, which both import, in .engines/triton) and runs in a subprocess whose PYTHONPATH holds only that
folder (tests/torchtitan_probe.py), so the two releases never mix and meshplan itself never imports torchtitan.
The probe parses an export as `torchrun -m torchtitan.train` would and then runs the release's own CPU-safe
construction code (ParallelDims, pipeline stage split, model on the meta device with its Float8 converters, the
AdamW optimizer and the LR schedule), and each test compares what the release built with the PLAN (not with the
export). The one stand-in: the Float8/MXFP8 converters' GPU-capability gate answers as the plan's GPU would.

With CI=true a release that is not installed is a failure; elsewhere these tests skip, naming the install command.
Set MESHPLAN_TT_REPORT=FILE to have every comparison written there as a table.
"""

from __future__ import annotations

import pytest
from torchtitan_support import (
    CASES_022,
    CASES_030,
    CC,
    FT_022,
    FT_030,
    INIT,
    MOE_022,
    MOE_030,
    SPLIT,
    actual_022,
    check_split,
    compare,
    engine,
    expected,
    plan,
    probe,
    run_cli_script,
    tolerances,
)

from meshplan.estimator.config import TrainConfig
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import load_model
from meshplan.planner.export import render, torchtitan_train_argv
from meshplan.planner.export.torchtitan_py import module_name
from meshplan.planner.plan_file import make_plan

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------------------------- the stage split
def test_stage_split_is_0_2_2s_own(results_022):
    """The blocks the estimate puts on each stage are those 0.2.2's own split function gives (`check_split`)."""
    check_split(results_022["split"])


# --------------------------------------------------------------------------------------------- 0.2.2: TOML
@pytest.fixture(scope="module")
def results_022(tmp_path_factory) -> dict:
    engine("0.2.2")
    d = tmp_path_factory.mktemp("tt022")
    reqs = {}
    for name, p in CASES_022.items():
        path = d / f"{name}.toml"
        path.write_text(render(p, "torchtitan-toml", "plan.yaml"))
        reqs[name] = {"argv": ["--job.config_file", str(path)], "world_size": p.cluster.gpus,
                      "cc": CC[p.hardware.id]}
    # the check can fail: a TOML key 0.2.2 has no field for
    p = CASES_022["8b-fsdp-accum"]
    bad = d / "bad.toml"
    bad.write_text(render(p, "torchtitan-toml", "plan.yaml").replace("[training]", "[training]\nnum_tokens = 1"))
    reqs["bad"] = {"argv": ["--job.config_file", str(bad)], "world_size": p.cluster.gpus}
    # and the parallelize step: dp_replicate 2 beside tp 8 without FSDP (the export refuses it; forced here)
    p = plan("llama3-8b", 16, tp=8, global_batch_size=16, seq_len=8192)
    ddp = d / "ddp-beside-tp.toml"
    text = render(p, "torchtitan-toml", "plan.yaml")
    assert "data_parallel_shard_degree = 2" in text
    ddp.write_text(text.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 2")
                   .replace("data_parallel_shard_degree = 2", "data_parallel_shard_degree = 1"))
    reqs["ddp-beside-tp"] = {"argv": ["--job.config_file", str(ddp)], "world_size": 16, "cc": CC[p.hardware.id]}
    p = plan("llama3-8b", 8, dp_replicate=8, global_batch_size=16, seq_len=8192)  # DDP alone: exported
    alone = d / "ddp-alone.toml"
    alone.write_text(render(p, "torchtitan-toml", "plan.yaml"))
    reqs["ddp-alone"] = {"argv": ["--job.config_file", str(alone)], "world_size": 8, "cc": CC[p.hardware.id]}
    return probe("0.2.2", reqs | {"split": SPLIT})


@pytest.mark.parametrize("case", sorted(CASES_022))
def test_0_2_2_parses_the_toml_export_as_planned(results_022, case):
    r = results_022[case]
    assert "error" not in r, r.get("error")
    # 0.2.2's own parallelize function takes the layout (pipelines are split above, not parallelized here)
    assert r["parallelize"].startswith("ok: ") or CASES_022[case].parallel.pp > 1, r["parallelize"]
    compare("0.2.2", case, expected(CASES_022[case], "output"), actual_022(r), tolerances(CASES_022[case]))
    if CASES_022[case].parallel.float8 == "tensorwise":  # FSDP float8 all-gather + precomputed scales
        assert r["float8"] == [{"fsdp_float8_all_gather": True, "precompute_scale": True,
                                "scaling": "ScalingGranularity.TENSORWISE"}]


def test_0_2_2_refuses_ddp_beside_tp_as_the_export_and_the_planner_do(results_022):
    """The refusal of `torchtitan-toml` and of the torchtitan-2026-03 planner (rule ddp_alone) is the release's own:
    its parallelize function raises on dp_replicate 2 beside tp 8 without FSDP."""
    assert results_022["ddp-beside-tp"]["parallelize"] == "RuntimeError: DDP has not supported > 1D parallelism"
    assert results_022["ddp-alone"]["parallelize"] == "ok: DDPTransformer"  # what the core runs for such a plan


def test_0_2_2_rejects_a_field_it_does_not_know(results_022):
    """The check above can fail: 0.2.2's own parser refuses a TOML key it has no field for."""
    r = results_022["bad"]
    assert "Invalid field names" in r["error"] and "num_tokens" in r["error"]




# --------------------------------------------------------------------------------------------- refusals, names
def test_moe_plans_torchtitan_cannot_build_are_refused():
    """A MoE model of no torchtitan flavor, Llama 4 on 0.3.0, Qwen3 with PP on 0.2.2, and 235B-A22B on 0.3.0's
    command line (which cannot change the flavor) are each refused in one line; nothing silently becomes dense."""
    spec = load_model("qwen3-30b-a3b").model_copy(update={"name": "my-moe", "layers": 24})
    mine = make_plan(spec, "my-moe.yaml", load_hardware("h100-sxm"),
                     TrainConfig(gpus=8, dp_shard=-1, ep=8, seq_len=4096, global_batch_size=8))
    for fmt in ("torchtitan-toml", "torchtitan-py"):
        with pytest.raises(MeshplanError, match="has the shapes of my-moe|shapes of none of the torchtitan"):
            render(mine, fmt, "plan.yaml")
    with pytest.raises(MeshplanError, match="0.3.0 has no llama4.*torchtitan-toml"):
        render(MOE_022["llama4-scout-tp8-ep2"], "torchtitan-py", "plan.yaml")
    with pytest.raises(MeshplanError, match="0.2.2 has no pipeline parallelism for qwen3"):
        render(MOE_030["qwen3-235b-pp4-ep8"], "torchtitan-toml", "plan.yaml")
    script = render(MOE_030["qwen3-235b-pp4-ep8"], "torchtitan-cli", "plan.yaml")
    assert "# STOPS unless TT_CONFIG is set" in script and "235B-A22B" in script


def test_tensorwise_and_custom_models_are_refused_for_0_3_0():
    tw = CASES_022["70b-fsdp-tp-float8-compile-asynctp"]
    with pytest.raises(MeshplanError, match="no tensorwise Float8 recipe.*torchtitan-toml"):
        render(tw, "torchtitan-py", "plan.yaml")
    spec = load_model("llama3-8b").model_copy(update={"name": "my-model", "layers": 16})
    custom = make_plan(spec, "my-model.yaml", load_hardware("h100-sxm"),
                       TrainConfig(gpus=8, dp_shard=-1, seq_len=4096, global_batch_size=8))
    with pytest.raises(MeshplanError, match="shapes of none of the torchtitan 0.3.0 models"):
        render(custom, "torchtitan-py", "plan.yaml")
    with pytest.raises(MeshplanError, match="shapes of none of the torchtitan 0.3.0 models"):
        torchtitan_train_argv(custom, "/x/meshplan_job.py")
    assert "TT_CONFIG" in render(custom, "torchtitan-cli", "plan.yaml")  # the user's own config function
    a100 = plan("llama3-405b", 512, hw="a100-sxm-80g", tp=8, pp=8, global_batch_size=512, seq_len=4096, ac="full")
    with pytest.raises(MeshplanError, match="llama3_405b.*no FP8"):
        render(a100, "torchtitan-py", "plan.yaml")


def test_finetune_plans_a_release_cannot_run_are_refused_in_one_line(tmp_path):
    """LoRA on 0.2.2 (no LoRA there), QLoRA on 0.3.0 (no NF4), q without k and v on 0.3.0 (fused wqkv), LoRA on
    0.3.0's command line (a model converter), a relative checkpoint path (torchtitan wants it absolute): each is
    refused in one line that says what to do; nothing is exported without the adapters."""
    lora = FT_030["70b-lora-r16"]
    with pytest.raises(MeshplanError, match="0.2.2 has no LoRA.*torchtitan-py") as e:
        render(lora, "torchtitan-toml", "plan.yaml")
    assert "\n" not in str(e.value)
    qlora = plan("llama3-70b", 16, finetune="qlora", init_from=INIT, global_batch_size=32, seq_len=4096)
    for fmt in ("torchtitan-py", "torchtitan-toml"):
        with pytest.raises(MeshplanError, match="no QLoRA"):
            render(qlora, fmt, "plan.yaml")
    q_only = plan("llama3-8b", 8, finetune="lora", lora_targets=("q", "v"), init_from=INIT, global_batch_size=8)
    with pytest.raises(MeshplanError, match="fuses q, k and v into one wqkv.*adapts q, v only"):
        render(q_only, "torchtitan-py", "plan.yaml")
    out, record = run_cli_script(lora, tmp_path)
    assert out.returncode == 2 and not record.exists()
    assert len(out.stderr.splitlines()) == 1 and "LoRA" in out.stderr and "--format torchtitan-py" in out.stderr
    ft = FT_022["70b-full-offload"].finetune.model_copy(update={"init_from": "ckpt/llama"})
    relative = FT_022["70b-full-offload"].model_copy(update={"finetune": ft})
    with pytest.raises(MeshplanError, match="absolute initial_load_path"):
        render(relative, "torchtitan-toml", "plan.yaml")


@pytest.mark.parametrize("path", ["job.toml", "/x/9lives.py", "/x/class.py", "/x/llama3.py", "/x/json.py",
                                  "/x/datasets.py", "/x/my-job.py"])
def test_module_names_that_would_not_import_as_the_job_are_refused(path):
    with pytest.raises(MeshplanError, match="torchtitan-py"):
        module_name(path)


def test_torchtitan_train_argv():
    p = CASES_030["8b-fsdp-accum"]
    assert torchtitan_train_argv(p, "/jobs/meshplan_job.py") == [
        "-m", "torchtitan.train", "--module", "meshplan_job", "--config", "meshplan_config"]
