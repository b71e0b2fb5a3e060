"""What a framework runs (a stack profile's `runs`): the planner searches only that, `estimate` refuses the rest in
one line, and the exports and launches refuse a plan estimated for another framework than torchtitan."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runner import run_cli

from meshplan.estimator.config import AC_MODES, FLOAT8_RECIPES, PP_SCHEDULES, TrainConfig
from meshplan.estimator.errors import InputError, MeshplanError
from meshplan.estimator.framework_runs import as_replicas, refusal
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import load_model
from meshplan.estimator.report import estimate
from meshplan.estimator.stack import load_stack
from meshplan.planner.export import FORMATS, render
from meshplan.planner.plan_file import core_refusal, make_plan
from meshplan.planner.search import plan_search
from meshplan.planner.space import SearchSpace
from meshplan.planner.tree import decision_tree


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama3-8b")


@pytest.fixture(scope="module")
def h100():
    return load_hardware("h100-sxm")


@pytest.fixture(scope="module")
def nanotron_search(llama8b, h100):
    return plan_search(llama8b, h100, load_stack("nanotron-zero1"), 32, 8, 4096, 1024)


def test_profiles_say_what_their_framework_runs(tmp_path):
    nano = load_stack("nanotron").runs
    assert (nano.schedules(), nano.ac_modes(), nano.float8_recipes()) == (("GPipe", "1F1B"), ("none", "full"), ("none",))
    assert not nano.compile and not nano.async_tp and not nano.on_core and nano.finetune_modes() == ("none", "full")
    assert load_stack("nanotron-zero1").runs == nano  # extends nanotron: the same framework
    assert load_stack("megatron-core").runs.schedules() == ("1F1B", "Interleaved1F1B")
    assert load_stack("llm-foundry").runs.schedules() == () and not load_stack("llm-foundry").runs.tp
    assert load_stack("kempnerforge").runs.ac_modes() == ("none", "full")  # its "selective" is attention-only AC
    titan = load_stack("torchtitan").runs
    assert titan.on_core and titan.schedules() == PP_SCHEDULES and titan.ac_modes() == AC_MODES
    assert titan.float8_recipes() == FLOAT8_RECIPES
    # a profile extending another overrides one field of `runs` and keeps the rest
    mine = tmp_path / "my-nanotron.yaml"
    mine.write_text("extends: nanotron\nid: my-nanotron\nname: mine\nruns:\n  compile: true\n")
    runs = load_stack(str(mine)).runs
    assert runs.compile and runs.ac_modes() == ("none", "full") and not runs.on_core


def test_refusal_names_the_option_to_change():
    nano, titan = load_stack("nanotron"), load_stack("torchtitan")
    cfg = TrainConfig(gpus=16, dp_shard=16, ac="none")
    assert "use --dp-replicate 16 instead of --dp-shard 16" in refusal(nano, cfg)
    assert refusal(nano, TrainConfig(gpus=16, dp_replicate=16, dp_shard=1, ac="selective")).endswith(
        "use --ac none or full")
    assert "torch.compile" in refusal(nano, TrainConfig(dp_shard=1, ac="full", compile=True))
    assert "Interleaved1F1B" in refusal(nano, TrainConfig(dp_shard=1, pp=2, pp_schedule="Interleaved1F1B", ac="none"))
    assert refusal(nano, TrainConfig(dp_replicate=8, dp_shard=1, tp=2, pp=2, pp_schedule="GPipe", ac="full")) is None
    assert refusal(load_stack("megatron-core"), TrainConfig(float8="rowwise")).endswith(
        "use --float8 none, tensorwise or mxfp8")
    for cfg in (TrainConfig(gpus=16, dp_shard=16, ac="selective", compile=True, float8="rowwise", pp=1),
                TrainConfig(pp=2, pp_schedule="Interleaved1F1B", tp=2, async_tp=True, compile=True)):
        assert refusal(titan, cfg) is None


def test_an_inferred_data_parallel_degree_runs_as_replicas_without_fsdp():
    nano = load_stack("nanotron")
    out = as_replicas(nano, TrainConfig(gpus=16, tp=2), gpus_per_node=8)
    assert (out.dp_replicate, out.dp_shard) == (8, 1)
    assert (as_replicas(nano, TrainConfig(), gpus_per_node=8).dp_replicate) == 8  # one node, as resolve infers
    assert as_replicas(load_stack("torchtitan"), TrainConfig(gpus=16, tp=2), 8).dp_shard == -1
    assert as_replicas(nano, TrainConfig(gpus=16, tp=3), 8).dp_shard == -1  # left for resolve to refuse


def test_estimate_cli_under_nanotron(cli):
    out = cli("estimate", "--model", "llama3-8b", "--gpus", "16", "--stack", "nanotron", "--seq-len", "4096",
              "--global-batch-size", "256", "--json")
    assert out.returncode == 0, out.stderr
    c = json.loads(out.stdout)["config"]
    assert (c["dp_replicate"], c["dp_shard"], c["ac"]) == (16, 1, "none")  # replicas; no op-level selective AC
    for args, says in ((("--dp-shard", "16"), "--dp-replicate 16"), (("--ac", "selective"), "--ac none or full"),
                       (("--compile",), "--no-compile"), (("--float8", "tensorwise"), "--float8 none")):
        bad = cli("estimate", "--model", "llama3-8b", "--gpus", "16", "--stack", "nanotron", *args)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1


def test_the_search_holds_only_what_nanotron_runs(nanotron_search, llama8b, h100):
    c = nanotron_search.configs
    assert len(c) > 0 and len(nanotron_search.ranked) > 0
    assert (c.dp_shard == 1).all() and (c.compile == 0).all() and (c.float8 == 0).all() and (c.async_tp == 0).all()
    assert set(np.unique(c.ac)) == {AC_MODES.index("none"), AC_MODES.index("full")}
    assert set(np.unique(c.schedule[c.pp > 1])) == {PP_SCHEDULES.index("GPipe"), PP_SCHEDULES.index("1F1B")}
    assert (c.pp_first_stage_less_layers == 1).all()  # no even-split variants: nanotron splits by cost
    assert (c.tp > 1).any() and (c.pp > 1).any()
    titan = plan_search(llama8b, h100, load_stack("torchtitan"), 32, 8, 4096, 1024).configs
    assert (titan.dp_shard > 1).any() and (titan.compile == 1).any() and (titan.float8 > 0).any()


def test_a_pin_the_framework_does_not_run_is_an_input_error(llama8b, h100):
    for space, says in ((SearchSpace(ac=["selective"]), "AC selective"), (SearchSpace(float8=["tensorwise"]), "Float8"),
                        (SearchSpace(pp_schedule=["Interleaved1F1B"]), "Interleaved1F1B")):
        with pytest.raises(InputError, match=says):
            plan_search(llama8b, h100, load_stack("nanotron"), 16, 8, 4096, 256, space=space)


def test_the_decision_tree_of_a_framework_without_fsdp(nanotron_search):
    steps = decision_tree(nanotron_search)
    keys = [s["key"] for s in steps]
    assert steps[0]["label"] == "Data parallel" and "no FSDP" in steps[0]["adds"]
    assert not {"compile", "float8", "hsdp", "offload"} & set(keys)
    assert any(s["best"] is not None for s in steps)


@pytest.fixture(scope="module")
def nanotron_plan(llama8b, h100):
    cfg = TrainConfig(gpus=16, dp_replicate=16, dp_shard=1, ac="none", seq_len=4096, global_batch_size=256)
    stack = load_stack("nanotron")
    return make_plan(llama8b, "llama3-8b", h100, cfg, estimate(llama8b, h100, cfg, stack), stack="nanotron")


def test_exports_and_the_core_refuse_another_frameworks_plan(nanotron_plan):
    for fmt in FORMATS:
        with pytest.raises(MeshplanError, match="estimated for stack nanotron"):
            render(nanotron_plan, fmt, "/shared/plan.yaml")
    assert "estimated for stack nanotron" in core_refusal(nanotron_plan)
    titan = nanotron_plan.model_copy(update={"stack": "torchtitan", "stack_profile": None})
    assert core_refusal(titan) is None and render(titan, "torchrun", "/shared/plan.yaml")


def test_export_cli_refuses_and_writes_nothing(nanotron_plan, tmp_path):
    from meshplan.planner.plan_file import save_plan

    path = tmp_path / "nano.yaml"
    save_plan(nanotron_plan, path)
    out = run_cli("export", str(path), "--format", "torchtitan-toml", "--output", str(tmp_path / "job.toml"))
    assert out.returncode == 2 and "meshplan estimate --plan PLAN --stack torchtitan" in out.stderr
    assert not (tmp_path / "job.toml").exists()
    traced = run_cli("trace", str(path))  # the trace runs the core's code, not nanotron's
    assert traced.returncode == 2 and "meshplan trace runs" in traced.stderr and "Traceback" not in traced.stderr
    again = run_cli("estimate", "--plan", str(path), "--trace")
    assert again.returncode == 2 and "--trace runs the training core's code" in again.stderr and not again.stdout
    fixed = run_cli("estimate", "--plan", str(path), "--stack", "torchtitan", "-o", str(tmp_path / "tt.yaml"), "--json")
    assert fixed.returncode == 0, fixed.stderr
    ok = run_cli("export", str(tmp_path / "tt.yaml"), "--format", "torchrun", "--output", str(tmp_path / "run.sh"))
    assert ok.returncode == 0, ok.stderr


def test_capacity_searches_what_the_framework_runs(llama8b, h100):
    from meshplan.planner.capacity import capacity_options

    opts = capacity_options(llama8b, [h100], load_stack("nanotron"), 1e11, 4096, 4096 * 256, node_counts=(1, 2))
    assert [o.fits for o in opts] == [True, True]
    assert all(not o.config["compile"] and not o.config["async_tp"] and o.config["dp_shard"] == 1 for o in opts)
    titan = capacity_options(llama8b, [h100], load_stack("torchtitan"), 1e11, 4096, 4096 * 256, node_counts=(1,))
    assert titan[0].config["compile"]


def test_a_pinned_replica_count_without_fsdp_is_all_of_data_parallel(llama8b, h100):
    res = plan_search(llama8b, h100, load_stack("nanotron"), 16, 8, 4096, 256, space=SearchSpace(dp_replicate=[2, 4]))
    c = res.configs
    assert (c.dp_shard == 1).all() and set(np.unique(c.dp_replicate)) <= {2, 4}  # never 2 replicas x 2 shards
    assert set(np.unique(c.tp * c.pp * c.cp)) <= {8, 4}


def test_the_pages_pin_choices_follow_the_framework():
    from meshplan.ui.web.inputs import pin_choices

    choices = {"tp": [1, 2], "dp_replicate": [1, 2], "pp_schedule": list(PP_SCHEDULES), "vpp": [2, 4],
               "ac": list(AC_MODES), "float8": list(FLOAT8_RECIPES), "compile": [True, False]}
    nano = pin_choices(choices, load_stack("nanotron"))
    assert nano == {"tp": [1, 2], "pp_schedule": ["GPipe", "1F1B"], "ac": ["none", "full"]}
    assert pin_choices(choices, load_stack("torchtitan")) == choices


def test_a_torchtitan_plan_re_estimated_under_nanotron_says_to_plan_again(tmp_path):
    made = run_cli("estimate", "--model", "llama3-8b", "--gpus", "8", "-o", str(tmp_path / "tt.yaml"), "--json")
    assert made.returncode == 0, made.stderr
    out = run_cli("estimate", "--plan", str(tmp_path / "tt.yaml"), "--stack", "nanotron")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "stack nanotron has no FSDP" in out.stderr and "plan again with --stack nanotron" in out.stderr
    assert "--dp-replicate" not in out.stderr  # no flag of this command changes a plan's layout
