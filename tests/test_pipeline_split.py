"""Pipeline stages split as torchtitan splits them (estimator/physics/stages.py): the embedding and the output count
as pp_first_stage_less_layers / pp_last_stage_less_layers layers (1 each by default), the sum is split evenly over
the (virtual) stages with the extra layers on the first ones, and the first / last stage hold that many fewer
blocks. The estimate, the plan file, the planner, the command line and the training core all follow it; the real
releases' own split is compared in tests/test_torchtitan_real.py and tests/test_torchtitan_030.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.errors import ConfigError
from meshplan.estimator.model_spec import ModelSpec
from meshplan.estimator.physics.stages import rank_blocks, stage_blocks, uneven
from meshplan.planner.plan_file import load_plan, make_plan, plan_fingerprint, plan_yaml, save_plan

L70, H100, TT = load_model("llama3-70b"), load_hardware("h100-sxm"), load_stack("torchtitan")
# the configuration: 70B on 64 GPUs, tp 8 x pp 8, full AC
PP8 = dict(gpus=64, tp=8, pp=8, seq_len=8192, global_batch_size=64, ac="full")


# torchtitan's split (generate_llm_fqn_per_model_part, 0.2.2 and 0.3.0 alike), worked by hand for 80 layers
@pytest.mark.parametrize(
    ("stages", "first", "last", "blocks"),
    [
        (8, 1, 1, [10, 11, 10, 10, 10, 10, 10, 9]),  # 82 = 8 x 10 + 2: stages 0 and 1 take 11 units, 0 gives 1 back
        (5, 1, 1, [16, 17, 16, 16, 15]),  # 82 = 5 x 16 + 2
        (3, 1, 1, [27, 27, 26]),  # 82 = 3 x 27 + 1
        (16, 1, 1, [5, 6] + [5] * 13 + [4]),  # pp 8 x vpp 2: 82 = 16 x 5 + 2
        (8, 0, 0, [10] * 8),  # both weights 0: 80 = 8 x 10
        (8, 2, 1, [9, 11, 11, 10, 10, 10, 10, 9]),  # 83 = 8 x 10 + 3
    ],
)
def test_80_layers_split_as_torchtitan_splits_them(stages, first, last, blocks):
    assert stage_blocks(80, stages, first, last) == blocks
    assert sum(blocks) == 80


def test_a_rank_holds_its_looped_stages():
    # pp 8 x vpp 2: rank r holds stages r and r + 8 of the 16 above: 5 + 5, 6 + 5, ..., 5 + 4
    assert [int(rank_blocks(80, 8, 2, 1, 1, r)) for r in range(8)] == [10, 11, 10, 10, 10, 10, 10, 9]
    ranks = np.arange(8.0)  # the same on arrays (the planner's sweeps)
    assert rank_blocks(80.0, np.full(8, 8.0), np.full(8, 2.0), np.ones(8), np.ones(8), ranks).tolist() == \
        [10, 11, 10, 10, 10, 10, 10, 9]
    assert bool(uneven(80, 8, 1)) and bool(uneven(80, 5, 1)) and not uneven(80, 3, 1) and not uneven(126, 8, 1)


@pytest.mark.parametrize(("pp", "blocks"), [(8, [10, 11, 10, 10, 10, 10, 10, 9]), (5, [16, 17, 16, 16, 15])])
def test_per_stage_holds_each_stage_its_own_blocks(pp, blocks):
    r = estimate(L70, H100, TrainConfig(**{**PP8, "pp": pp, "gpus": 8 * pp}), TT)
    stages = r["memory"]["per_stage"]
    assert [s["blocks"] for s in stages] == blocks
    assert r["memory"]["peak_gib"] == max(s["peak_gib"] for s in stages)  # the worst-stage search finds the worst


def test_the_heavier_middle_stage_is_what_the_default_split_costs():
    """80 layers on pp 8: the default split's second stage holds 11 blocks where the even split holds 10; the step
    runs at the rank with the most blocks, so the even split is faster, and its second stage peaks below the default
    split's (1F1B: an earlier stage holds more microbatches in flight, so stage 1 peaks at least as high as stage 2)."""
    default = estimate(L70, H100, TrainConfig(**PP8), TT)
    even = estimate(L70, H100, TrainConfig(**PP8, pp_first_stage_less_layers=0, pp_last_stage_less_layers=0), TT)
    d, e = default["memory"]["per_stage"], even["memory"]["per_stage"]
    assert [s["blocks"] for s in e] == [10] * 8
    assert e[2]["peak_gib"] <= e[1]["peak_gib"] < d[1]["peak_gib"]
    assert even["throughput"]["tokens_per_sec_per_gpu"] > default["throughput"]["tokens_per_sec_per_gpu"]
    assert even["config"]["pp_first_stage_less_layers"] == 0 and "pp_first_stage_less_layers" not in default["config"]


def test_stages_may_hold_the_embedding_or_the_output_alone():
    """torchtitan splits layers + 1 + 1 units (and refuses more stages than that); Megatron-LM does the same with
    account_for_embedding / loss_in_pipeline_split: a published Qwen3-235B run (94 layers) on pp 32 x vpp 3 = 96
    stages. The first stage then holds the embedding alone, the last the norm and output alone."""
    assert stage_blocks(94, 96) == [0] + [1] * 94 + [0]
    four = load_model("llama3-8b").model_copy(update={"layers": 4})
    cfg = dict(gpus=6, gpus_per_node=6, pp=6, seq_len=4096, global_batch_size=12, pp_schedule="GPipe")
    r = estimate(four, H100, TrainConfig(**cfg), TT)
    assert r["throughput"]["tokens_per_sec_per_gpu"] > 0
    with pytest.raises(ConfigError, match="pp 7 x vpp 1 = 7 stages exceed the 4 layers [+] 2 for the embedding"):
        TrainConfig(**{**cfg, "gpus": 7, "gpus_per_node": 7, "pp": 7, "global_batch_size": 14}).resolve(four, H100)
    with pytest.raises(ConfigError, match="exceed the 4 layers [+] 0 for"):
        TrainConfig(**{**cfg, "pp_first_stage_less_layers": 0, "pp_last_stage_less_layers": 0}).resolve(four, H100)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("pp_first_stage_less_layers", -1, "pp_first_stage_less_layers -1 is negative"),
    ("pp_last_stage_less_layers", 12, "pp_last_stage_less_layers 12 exceeds 11, the layers each of the 8 stages"),
])
def test_bad_weights_are_one_line_naming_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message) as err:
        TrainConfig(**PP8, **{field: value}).resolve(L70, H100)
    assert err.value.field == field and "\n" not in str(err.value)
    assert err.value.for_cli().startswith("--" + field.replace("_", "-"))


@pytest.mark.parametrize(("flag", "value"), [("--pp-first-stage-less-layers", "-1"),
                                             ("--pp-last-stage-less-layers", "12")])
def test_cli_refuses_bad_weights_in_one_line(cli, flag, value):
    args = [f"--{k.replace('_', '-')}={v}" for k, v in PP8.items()]
    out = cli("estimate", "--model", "llama3-70b", *args, flag, value)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"meshplan: error: {flag} {value} ")


def test_cli_estimates_the_even_split(cli):
    args = [f"--{k.replace('_', '-')}={v}" for k, v in PP8.items()]
    out = cli("estimate", "--model", "llama3-70b", *args, "--pp-first-stage-less-layers", "0",
              "--pp-last-stage-less-layers", "0", "--json")
    assert out.returncode == 0, out.stderr
    assert [s["blocks"] for s in json.loads(out.stdout)["memory"]["per_stage"]] == [10] * 8


def test_plan_file_round_trips_the_weights_and_leaves_defaults_out(tmp_path):
    cfg = TrainConfig(**PP8, dp_shard=1, pp_first_stage_less_layers=0, pp_last_stage_less_layers=2)
    plan = make_plan(L70, "llama3-70b", H100, cfg)
    path = save_plan(plan, tmp_path / "plan.yaml")
    back = load_plan(path)
    assert (back.parallel.pp_first_stage_less_layers, back.parallel.pp_last_stage_less_layers) == (0, 2)
    assert back.train_config().pp_last_stage_less_layers == 2
    assert plan_fingerprint(back) == plan_fingerprint(plan)
    default = make_plan(L70, "llama3-70b", H100, TrainConfig(**PP8, dp_shard=1))
    assert "stage_less_layers" not in plan_yaml(default)
    assert plan_fingerprint(default) != plan_fingerprint(plan)


def test_a_default_plan_keeps_the_fingerprint_it_had_before_the_weights():
    # computed with the plan code before the two fields existed (a run directory of such a plan still resumes)
    spec = ModelSpec(name="fp-8l", layers=8, hidden=512, heads=8, kv_heads=4, ffn_hidden=1536, vocab=2048)
    plan = make_plan(spec, "fp-8l", H100, TrainConfig(gpus=8, pp=4, dp_shard=2, seq_len=1024, global_batch_size=16))
    assert plan_fingerprint(plan) == "3b735e373ab64f5c"


def test_plan_file_refuses_a_negative_weight(tmp_path):
    plan = make_plan(L70, "llama3-70b", H100, TrainConfig(**PP8, dp_shard=1))
    text = plan_yaml(plan).replace("  pp_schedule: 1F1B\n", "  pp_schedule: 1F1B\n  pp_first_stage_less_layers: -1\n")
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(Exception, match="pp_first_stage_less_layers") as err:
        load_plan(tmp_path / "bad.yaml")
    assert "\n" not in str(err.value)


def test_planner_tries_the_even_split_where_the_default_is_uneven():
    from meshplan.planner.search import plan_search

    res = plan_search(L70, H100, TT, 64, 8, 8192, 512)
    c = res.configs
    even = np.flatnonzero(c.pp_first_stage_less_layers == 0)
    assert len(even) and (c.pp[even] > 1).all() and (c.pp_last_stage_less_layers[even] == 0).all()
    assert all(bool(uneven(80, int(c.pp[i]), int(c.vpp[i]))) for i in even)
    ranked = [i for i in res.ranked if i in set(even.tolist())]
    assert ranked, "an even split fits"
    cfg = res.config(ranked[0])
    assert (cfg["pp_first_stage_less_layers"], cfg["pp_last_stage_less_layers"]) == (0, 0)
    assert res.train_config(ranked[0]).resolve(L70, H100).pp_first_stage_less_layers == 0
    default = np.flatnonzero((c.pp > 1) & (c.pp_first_stage_less_layers == 1))
    assert "pp_first_stage_less_layers" not in res.config(int(default[0]))


def test_core_runs_the_plan_with_the_split_it_was_estimated_with():
    from meshplan.launcher.core.config import RunConfig
    from meshplan.launcher.plan_run import run_config_fields

    plan = make_plan(L70, "llama3-70b", H100, TrainConfig(**PP8, dp_shard=1, pp_first_stage_less_layers=0,
                                                         pp_last_stage_less_layers=0))
    cfg = RunConfig.from_dict(run_config_fields(plan))
    assert (cfg.pp_first_stage_less_layers, cfg.pp_last_stage_less_layers) == (0, 0)
    try:
        from meshplan.launcher.core.parallelize import stage_layers
    except ImportError:  # no torch: the split itself is the estimator's (estimator/physics/stages.py)
        return
    assert [len(s) for s in stage_layers(80, 8, 0, 0)] == [10] * 8
    assert [len(s) for s in stage_layers(80, 8)] == [10, 11, 10, 10, 10, 10, 10, 9]


def test_stage_gradients_at_the_end_of_the_step():
    """Without FSDP (pp 2 alone under torchtitan 0.2.2's rules, fp32) a stage's gradients are the parameters' own,
    all of them there at the end of its backward (with FSDP the one reduction turns the unsharded gradients into
    sharded ones a block at a time: the traced pipelines of tests/launcher/test_trace.py hold that)."""
    m8 = load_model("llama3-8b")
    plain = estimate(m8, H100, TrainConfig(gpus=2, pp=2, dp_shard=1, seq_len=1024, global_batch_size=4),
                     load_stack("torchtitan-2026-03"))
    for s in plain["memory"]["per_stage"]:
        assert s["peak_phase"] == "end of backward"
        assert s["breakdown_gib"]["grads_fp32"] == s["breakdown_gib"]["params_fp32"]  # fp32 grads, every one
