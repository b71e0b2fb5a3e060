"""torchtitan 0.3.0 reads meshplan's exports as a Python config module (the `--module` / `--config` job, and what
`meshplan launch --engine torchtitan` writes) and as a command line, run by the real release and compared with the
plan field by field (how the releases are run and compared: tests/test_torchtitan_real.py,
tests/torchtitan_support.py)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_runner import run_cli
from torchtitan_support import (
    CASES_022,
    CASES_030,
    CC,
    CLI_CASES,
    CLI_REFUSED,
    SPLIT,
    actual_030,
    built_float8,
    check_split,
    compare,
    engine,
    entry_ok,
    expected,
    probe,
    run_cli_script,
    tolerances,
)

from meshplan.planner.export import render, torchtitan_train_argv
from meshplan.planner.export._common import TITAN_MODELS, preset_of
from meshplan.planner.export.torchtitan_03 import job
from meshplan.planner.export.torchtitan_py import DEPENDENCY_NAMES, TORCHTITAN_NAMES
from meshplan.planner.plan_file import Plan, load_plan, save_plan

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------------------------- 0.3.0: Python config
@pytest.fixture(scope="module")
def py_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tt030py")
    for name, p in CASES_030.items():
        (d / f"meshplan_{name.replace('-', '_')}.py").write_text(render(p, "torchtitan-py", "plan.yaml"))
    return d


def py_path(py_dir: Path, case: str) -> Path:
    return py_dir / f"meshplan_{case.replace('-', '_')}.py"


ENTRY_CASES = ["8b-fsdp-accum", "405b-pp-interleaved", "70b-lora-r16", "8b-tp8-bf16"]
LOCAL_TENSOR = ["--comm.mode", "local_tensor"]  # 0.3.0's main() stops right after loading the config


def _guarded(make):
    """make(), or the exception it raised (re-raised by the one test that needs it, not by the whole module)."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001
        return exc


def _given(value):
    if isinstance(value, Exception):
        raise value
    return value


@pytest.fixture(scope="module")
def tt030(tmp_path_factory, py_dir) -> SimpleNamespace:
    """Every 0.3.0 request of this module, answered by one probe process (its start is most of a request's cost):
    the Python config modules (parsed and built; and the 4 ENTRY_CASES through `python -m torchtitan.train`
    itself), the command-line exports (and the refused ones forced on; and one through the entry point), the old
    flags, `meshplan export`'s module, `meshplan launch --engine torchtitan`'s job, the stage split and the
    registries. `results` holds the answers; the other fields what the tests check on meshplan's side."""
    engine("0.3.0")
    tmp = tmp_path_factory.mktemp("tt030")
    reqs: dict[str, dict] = {}
    for name, p in CASES_030.items():
        argv = torchtitan_train_argv(p, py_path(py_dir, name))
        assert argv[:2] == ["-m", "torchtitan.train"]
        reqs[f"py:{name}"] = {"argv": argv[2:], "world_size": p.cluster.gpus, "cc": CC[p.hardware.id], "path": [py_dir]}
        if name in ENTRY_CASES:
            reqs[f"entry:py:{name}"] = {"kind": "entry", "argv": [*argv[2:], *LOCAL_TENSOR], "cc": CC[p.hardware.id],
                                        "path": [py_dir], "cwd": tmp}
    for name in CLI_CASES:
        p = CASES_030[name]
        reqs[f"cli:{name}"] = {"argv": script_argv(p, tmp_path_factory.mktemp(name)), "world_size": p.cluster.gpus,
                               "cc": CC[p.hardware.id]}
    # the stopping scripts, forced on with TT_CONFIG = the preset's config function: what the stop prevents
    for name in CLI_REFUSED:
        p = CASES_030[name]
        argv = script_argv(p, tmp_path_factory.mktemp(name), {"TT_CONFIG": job(p).config})
        reqs[f"forced:{name}"] = {"argv": argv, "world_size": p.cluster.gpus, "cc": CC[p.hardware.id]}
    p = CASES_030["70b-pp-1f1b"]
    cli_argv = script_argv(p, tmp_path_factory.mktemp("cli-entry"))
    reqs["entry:cli"] = {"kind": "entry", "argv": [*cli_argv[:-1], *LOCAL_TENSOR, *cli_argv[-1:]],
                         "cc": CC[p.hardware.id], "cwd": tmp}
    # the check can fail: flags the old export wrote, and PP with CUDA graphs on
    old = ["--training.max_context_length", "8192", "--training.num_tokens_per_microbatch_per_dp_rank", "8192",
           "--optimizer.beta1", "0.9", "--activation_checkpoint.mode", "full"]
    base = ["--module", "llama3", "--config", "llama3_8b"]
    reqs["old"] = {"argv": base + old, "world_size": 8}
    reqs["pp"] = {"argv": base + ["--parallelism.pipeline_parallel_degree", "2"], "world_size": 8}
    export = _guarded(lambda: _export_module(tmp / "export"))
    if not isinstance(export, Exception) and export["out"].returncode == 0:
        p = CASES_030["8b-hsdp-cp"]
        reqs["export"] = {"argv": export["argv"][2:], "world_size": p.cluster.gpus, "cc": CC[p.hardware.id],
                          "path": [export["target"].parent]}
    launched = _guarded(lambda: _launch_engine_torchtitan(tmp / "launch"))
    if not isinstance(launched, Exception):
        p = CASES_030["8b-fsdp-accum"]
        reqs["entry:launch"] = {"kind": "entry", "argv": [*launched["program"][2:], *LOCAL_TENSOR],
                                "cc": CC[p.hardware.id], "path": [launched["job_dir"]], "cwd": tmp}
    reqs["split"] = SPLIT
    reqs["registries"] = {"kind": "registries"}
    return SimpleNamespace(results=probe("0.3.0", reqs), cli_argv=cli_argv, export=export, launched=launched)


def test_stage_split_is_0_3_0s_own(tt030):
    """The blocks the estimate puts on each stage are those 0.3.0's own split function gives (`check_split`)."""
    check_split(tt030.results["split"])


@pytest.mark.parametrize("case", sorted(CASES_030))
def test_0_3_0_builds_the_python_export_as_planned(tt030, case):
    r = tt030.results[f"py:{case}"]
    assert "error" not in r, r.get("error")
    compare("0.3.0 (torchtitan-py)", case, expected(CASES_030[case], "lm_head"), actual_030(r),
            tolerances(CASES_030[case]))
    # the module of the torchtitan model with the plan's shapes (a plan from a config.json names no preset)
    assert r["model"]["name"] == TITAN_MODELS[preset_of(CASES_030[case])].name
    if CASES_030[case].parallel.ep > 1:  # the standard all-to-all syncs with the host: no CUDA graphs
        assert r["config"]["training"]["disable_cuda_graphs"] is True


@pytest.mark.parametrize("case", ENTRY_CASES)
def test_0_3_0_train_entry_point_accepts_the_python_export(tt030, case):
    """`python -m torchtitan.train --module M --config meshplan_config` itself, up to where training would start
    (`--comm.mode local_tensor` makes 0.3.0's main() stop right after loading the config)."""
    entry_ok(tt030.results[f"entry:py:{case}"])


def _export_module(d: Path) -> dict:
    """`meshplan export PLAN --format torchtitan-py -o DIR/meshplan_job.py` of the 8b-hsdp-cp plan."""
    plan_file = d / "plan.yaml"
    (d / "job").mkdir(parents=True)
    save_plan(CASES_030["8b-hsdp-cp"], plan_file)
    target = d / "job" / "meshplan_job.py"
    out = run_cli("export", str(plan_file), "--format", "torchtitan-py", "-o", str(target))
    argv = torchtitan_train_argv(load_plan(plan_file), target) if out.returncode == 0 else None
    return {"out": out, "target": target, "argv": argv}


def test_meshplan_export_writes_a_module_0_3_0_runs_as_planned(tt030):
    """`meshplan export PLAN --format torchtitan-py -o DIR/meshplan_job.py`, then 0.3.0 with DIR on PYTHONPATH."""
    p = CASES_030["8b-hsdp-cp"]
    export = _given(tt030.export)
    assert export["out"].returncode == 0, export["out"].stderr
    assert export["target"].stat().st_mode & 0o777 == 0o644
    argv = export["argv"]
    assert argv == ["-m", "torchtitan.train", "--module", "meshplan_job", "--config", "meshplan_config"]
    r = tt030.results["export"]
    assert "error" not in r, r.get("error")
    compare("0.3.0 (meshplan export -f torchtitan-py)", "8b-hsdp-cp", expected(p, "lm_head"), actual_030(r),
            tolerances(p))


# --------------------------------------------------------------------------------------------- 0.3.0: command line
def script_argv(p: Plan, tmp_path: Path, env: dict | None = None) -> list[str]:
    """torchtitan's argv from the real `torchtitan-cli` script, split off torchrun's own options by torch's
    torchrun parser."""
    from torch.distributed.run import get_args_parser

    out, record = run_cli_script(p, tmp_path, env)
    assert out.returncode == 0, out.stderr
    args = get_args_parser().parse_args(record.read_text().split("\0")[:-1])
    assert args.module and args.training_script == "torchtitan.train"
    return list(args.training_script_args)


@pytest.mark.parametrize("case", CLI_CASES)
def test_0_3_0_parses_the_cli_export_as_planned(tt030, case):
    r = tt030.results[f"cli:{case}"]
    assert "error" not in r, r.get("error")  # tyro exits on any option 0.3.0 does not know
    compare("0.3.0 (torchtitan-cli)", case, expected(CASES_030[case], "lm_head"), actual_030(r),
            tolerances(CASES_030[case]))


@pytest.mark.parametrize("case", CLI_REFUSED)
def test_cli_script_stops_where_0_3_0_would_train_with_other_float8(tt030, case, tmp_path):
    """The script cannot give the model the plan's Float8 (0.3.0 keeps the model off its command line): it stops
    before torchrun with one line naming torchtitan-py; forced on with TT_CONFIG, 0.3.0 indeed trains with other
    Float8 than planned."""
    p = CASES_030[case]
    text = render(p, "torchtitan-cli", "plan.yaml")
    assert "# STOPS unless TT_CONFIG is set:" in text
    out, record = run_cli_script(p, tmp_path)
    assert out.returncode == 2 and not record.exists(), out.stderr
    assert len(out.stderr.splitlines()) == 1 and "--format torchtitan-py" in out.stderr
    forced = tt030.results[f"forced:{case}"]
    assert "error" not in forced, forced.get("error")
    assert built_float8(forced)[0] != p.parallel.float8


def test_cli_script_stops_for_tensorwise_which_0_3_0_lacks(tmp_path):
    p = CASES_022["70b-fsdp-tp-float8-compile-asynctp"]
    out, record = run_cli_script(p, tmp_path)
    assert out.returncode == 2 and not record.exists()
    assert len(out.stderr.splitlines()) == 1 and "no tensorwise Float8 recipe" in out.stderr


def test_0_3_0_cli_entry_point_accepts_the_cli_export(tt030):
    assert tt030.cli_argv[-1] == "activation-checkpoint:full"  # a subcommand: further options go before it
    entry_ok(tt030.results["entry:cli"])


def test_0_3_0_rejects_the_old_flags_and_pp_without_disable_cuda_graphs(tt030):
    """The check above can fail: 0.3.0 refuses the flags the old export wrote, and PP with CUDA graphs on."""
    r = tt030.results
    assert r["old"]["error"].startswith("SystemExit: 2")
    said = " ".join(r["old"]["stderr"].split())
    for flag in ("--training.max_context_length", "--optimizer.beta1", "--activation_checkpoint.mode"):
        assert flag in said
    assert r["pp"]["error"].startswith("SystemExit: 2") and "disable_cuda_graphs" in r["pp"]["stderr"]




def test_reserved_names_cover_0_3_0s_registries(tt030):
    """meshplan's list of names 0.3.0 resolves to its own registries is complete for this release."""
    r = tt030.results["registries"]
    assert "error" not in r, r.get("error")
    names = set(r["names"])
    assert names and names <= TORCHTITAN_NAMES and "torchtitan" in DEPENDENCY_NAMES


def _launch_engine_torchtitan(d: Path) -> dict:
    """`meshplan launch PLAN --engine torchtitan` (local, written, not run) of the 8b-fsdp-accum plan."""
    from meshplan.launcher.launch import build_launch

    d.mkdir(parents=True)
    plan_file = save_plan(CASES_030["8b-fsdp-accum"], d / "plan.yaml")
    run_dir = d / "run"
    launch = build_launch(plan_file, "local", run_dir, steps=5, engine="torchtitan")
    program = launch.argv[launch.argv.index("torchtitan.train") - 1:]
    return {"plan_file": plan_file, "run_dir": run_dir, "launch": launch, "job_dir": run_dir / "torchtitan-job",
            "program": program}


def test_launch_engine_torchtitan_writes_a_job_0_3_0_runs(tt030):
    """`meshplan launch PLAN --engine torchtitan`: the module it writes into the run dir and the program arguments
    its launch runs are what 0.3.0's own entry point accepts (up to where training would start: local_tensor)."""
    from meshplan.launcher.launch import build_launch

    launched = _given(tt030.launched)
    plan_file, run_dir, launch, job_dir, program = (launched[k] for k in ("plan_file", "run_dir", "launch", "job_dir",
                                                                         "program"))
    assert (job_dir / "meshplan_job.py").is_file() and launch.env["PYTHONPATH"].split(os.pathsep)[0] == str(job_dir)
    assert program[:6] == ["-m", "torchtitan.train", "--module", "meshplan_job", "--config", "meshplan_config"]
    assert program[6:] == ["--dump_folder", str(run_dir.resolve())]
    entry_ok(tt030.results["entry:launch"])
    script = build_launch(plan_file, "slurm", run_dir, engine="torchtitan", write=False).text
    assert '-m torchtitan.train --module meshplan_job --config meshplan_config --dump_folder "$run_dir"' in script
    assert 'export PYTHONPATH="$run_dir/torchtitan-job${PYTHONPATH:+:$PYTHONPATH}"' in script
