"""torchtitan's parallelism.fsdp_reshard_after_forward (default / always / never) through the chain: the estimate's
memory and all-gathers, `validate` reading it from a column or a row's notes, `meshplan estimate
--fsdp-reshard-after-forward`, the plan file (the fingerprint ignores it: it changes no checkpoint) and the torchtitan
exports. The traced FSDP2 memory of each policy is held to the model in tests/launcher/test_trace.py, the real
releases' reading of the exports in tests/test_torchtitan_real.py and tests/test_torchtitan_030.py."""

from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

from meshplan.estimator import TrainConfig, load_hardware, load_model, load_stack
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.report import estimate
from meshplan.estimator.validate import reshard_policy, validate_rows
from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.core.parallelize import reshard_after_forward
from meshplan.launcher.plan_run import run_config_fields
from meshplan.planner.export import render
from meshplan.planner.plan_file import load_plan, make_plan, plan_fingerprint, plan_yaml, save_plan

H100, TT = load_hardware("h100-sxm"), load_stack("torchtitan")
M8 = load_model("llama3-8b")
FSDP8 = dict(gpus=8, seq_len=8192, global_batch_size=16)
PP2 = dict(gpus=8, pp=2, seq_len=4096, global_batch_size=32)
GIB = 2**30


def _est(policy: str, **kw) -> dict:
    return estimate(M8, H100, TrainConfig(**kw, fsdp_reshard_after_forward=policy), TT)


def test_never_keeps_the_whole_model_gathered_and_skips_the_backward_gather():
    default, never = _est("default", **FSDP8), _est("never", **FSDP8)
    gathered = never["memory"]["breakdown_gib"]["unsharded_params"]
    assert gathered == pytest.approx(2 * M8.params / GIB, rel=1e-3)  # every bf16 weight on every rank
    assert default["memory"]["breakdown_gib"]["unsharded_params"] < gathered / 5
    assert never["memory"]["peak_gib"] > default["memory"]["peak_gib"] + gathered * 0.8
    # one all-gather a microbatch instead of two: never slower
    assert never["throughput"]["tokens_per_sec_per_gpu"] >= default["throughput"]["tokens_per_sec_per_gpu"]
    assert never["config"]["fsdp_reshard_after_forward"] == "never"
    assert "fsdp_reshard_after_forward" not in default["config"]  # the default reads as before the field


def test_always_is_the_default_without_a_pipeline_and_regathers_with_one():
    assert _est("always", **FSDP8)["throughput"] == _est("default", **FSDP8)["throughput"]
    default, always = _est("default", **PP2), _est("always", **PP2)
    # the stage's forward reshards, so its backward gathers again: slower, never more memory
    assert always["throughput"]["tokens_per_sec_per_gpu"] < default["throughput"]["tokens_per_sec_per_gpu"]
    assert always["memory"]["peak_gib"] <= default["memory"]["peak_gib"]


@pytest.mark.parametrize(("row", "policy"), [
    ({"notes": "FSDP reshard_after_forward policy=never (params stay unsharded)"}, "never"),
    ({"notes": "--parallelism.fsdp_reshard_after_forward always"}, "always"),
    ({"notes": "fsdp_reshard_after_forward = \"never\""}, "never"),
    ({"notes": "nothing said"}, "default"),
    ({"fsdp_reshard_after_forward": "Never", "notes": "reshard_after_forward: always"}, "never"),  # the column wins
])
def test_validate_reads_the_policy_from_a_column_or_the_notes(row, policy):
    assert reshard_policy(row) == policy


def test_validate_predicts_a_row_with_its_policy_and_names_a_bad_one():
    row = {"id": "r1", "framework": "torchtitan", "model": "Llama 3 8B", "hardware": "h100-sxm", "gpus": "8",
           "gpus_per_node": "8", "dp_shard": "8", "seq_len": "8192", "global_batch_size": "8",
           "micro_batch_size": "1", "precision": "bf16", "ac": "selective", "compile": "false",
           "measured_tps_per_gpu": "5000", "measured_mem_gib": "60"}
    plain, never = validate_rows([row, {**row, "id": "r2", "notes": "reshard_after_forward policy=never"}])
    assert never.predicted_mem_gib > plain.predicted_mem_gib + 14
    (bad,) = validate_rows([{**row, "fsdp_reshard_after_forward": "sometimes"}])
    assert bad.error == "row r1: fsdp_reshard_after_forward 'sometimes' is not one of default, always, never"
    with pytest.raises(MeshplanError, match="is not one of default, always, never"):
        reshard_policy({"id": "x", "fsdp_reshard_after_forward": "off"})


def test_plan_file_round_trip_and_fingerprint(tmp_path):
    cfg = TrainConfig(**FSDP8, fsdp_reshard_after_forward="never")
    plan = make_plan(M8, "llama3-8b", H100, cfg, steps=10)
    base = make_plan(M8, "llama3-8b", H100, TrainConfig(**FSDP8), steps=10)
    assert "fsdp_reshard_after_forward: never" in plan_yaml(plan)
    assert "fsdp_reshard_after_forward" not in plan_yaml(base)
    assert plan_fingerprint(plan) == plan_fingerprint(base)  # a run may resume under another policy
    save_plan(plan, tmp_path / "p.yaml")
    back = load_plan(tmp_path / "p.yaml")
    assert back.train_config().fsdp_reshard_after_forward == "never"
    run = RunConfig.from_dict(run_config_fields(back))
    assert run.fsdp_reshard_after_forward == "never" and reshard_after_forward(run) is False


@pytest.mark.parametrize(("policy", "pp", "expected"), [
    ("default", 1, True), ("default", 2, False), ("always", 2, True), ("never", 1, False)])
def test_the_training_core_passes_torchtitans_policy_to_fully_shard(policy, pp, expected):
    run = RunConfig.from_dict({"model": M8.model_dump(), "pp": pp, "fsdp_reshard_after_forward": policy})
    assert reshard_after_forward(run) is expected


@pytest.mark.parametrize(("fmt", "text"), [
    ("torchtitan-toml", 'fsdp_reshard_after_forward = "never"'),
    ("torchtitan-py", "fsdp_reshard_after_forward='never'"),
    ("torchtitan-cli", "--parallelism.fsdp_reshard_after_forward never"),
])
def test_exports_carry_the_policy(fmt, text):
    plan = make_plan(M8, "llama3-8b", H100, TrainConfig(**FSDP8, fsdp_reshard_after_forward="never"), steps=10)
    out = render(plan, fmt)
    assert text in out
    assert "fsdp_reshard_after_forward" not in render(make_plan(M8, "llama3-8b", H100, TrainConfig(**FSDP8), steps=10),
                                                      fmt)


def test_cli_estimate_flag_json_and_bad_value(tmp_path):
    r = run_cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--fsdp-reshard-after-forward", "never", "--json",
                "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["fsdp_reshard_after_forward"] == "never"
    assert load_plan(tmp_path / "p.yaml").parallel.fsdp_reshard_after_forward == "never"
    r = run_cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--fsdp-reshard-after-forward", "sometimes")
    assert r.returncode != 0 and "Traceback" not in r.stderr and "sometimes" in r.stderr


def test_planner_plans_the_policy_asked_for():
    """One policy for the whole search (no dimension of it), handed on to each configuration, its labels and the
    plan; never makes fewer layouts fit (more memory), default reads as before."""
    from meshplan.planner.labels import compact_config, short_config
    from meshplan.planner.search import plan_search
    from meshplan.planner.space import SearchSpace

    space = dict(tp=[1], cp=[1], pp=[1], ac=["selective"], float8=["none"], compile=[True])
    default = plan_search(M8, H100, TT, 8, 8, 8192, 16, space=SearchSpace(**space))
    never = plan_search(M8, H100, TT, 8, 8, 8192, 16, space=SearchSpace(**space, fsdp_reshard_after_forward="never"))
    assert 0 < len(never.ranked) <= len(default.ranked)
    best = never.config(int(never.ranked[0]))
    assert best["fsdp_reshard_after_forward"] == "never" and "fsdp_reshard_after_forward" not in default.config(0)
    assert short_config(best).endswith("reshard never") and compact_config(best).endswith("rs:never")
    plan = make_plan(M8, "llama3-8b", H100, never.train_config(int(never.ranked[0])))
    assert plan.parallel.fsdp_reshard_after_forward == "never"


def test_plan_cli_writes_the_policy(tmp_path):
    r = run_cli("plan", "--model", "llama3-8b", "--nodes", "1", "--seq-len", "8192", "--global-batch-size", "16",
                "--tp", "1", "--pp", "1", "--cp", "1", "--top", "2", "--fsdp-reshard-after-forward", "never", "--json",
                "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 0, r.stderr
    assert all(p["config"]["fsdp_reshard_after_forward"] == "never" for p in json.loads(r.stdout)["plans"])
    assert load_plan(tmp_path / "p.yaml").parallel.fsdp_reshard_after_forward == "never"


def test_trace_report_names_the_policy():
    """`meshplan trace` traces the plan's policy and says so (its --json config, its header line)."""
    from meshplan.estimator.model_spec import ModelSpec
    from meshplan.launcher.trace_compare import trace_plan

    tiny = ModelSpec(name="rs-2l", layers=2, hidden=256, heads=4, kv_heads=2, ffn_hidden=512, vocab=1024)
    cfg = TrainConfig(gpus=4, seq_len=256, global_batch_size=4, fsdp_reshard_after_forward="never")
    report = trace_plan(make_plan(tiny, "rs-2l", H100, cfg, steps=10))
    assert report["config"]["fsdp_reshard_after_forward"] == "never"
    (rank,) = report["ranks"]
    assert rank["traced"]["unsharded_params"] >= 2 * tiny.params  # every bf16 weight gathered at once


def test_a_plan_file_with_an_unknown_policy_is_one_line(tmp_path):
    plan = make_plan(M8, "llama3-8b", H100, TrainConfig(**FSDP8, fsdp_reshard_after_forward="never"), steps=10)
    bad = tmp_path / "bad.yaml"
    bad.write_text(plan_yaml(plan).replace("fsdp_reshard_after_forward: never", "fsdp_reshard_after_forward: sometimes"))
    for args in (("estimate", "--plan", str(bad)), ("export", str(bad), "-f", "torchtitan-toml", "-o",
                                                      str(tmp_path / "job.toml"))):
        r = run_cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.strip().count("\n") == 0 and "fsdp_reshard_after_forward" in r.stderr
    assert not (tmp_path / "job.toml").exists()
