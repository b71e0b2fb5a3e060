"""A plan made with a stack profile YAML (`meshplan plan --stack ./mycluster.yaml`, the profile `meshplan calibrate`
writes) keeps that profile, so it estimates, exports and launches the same from any folder and on a cluster where the
file is not; a relative `extends:` is read from the extending file's folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from cli_runner import run_cli

from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.stack import load_stack
from meshplan.planner.plan_file import load_plan, save_plan


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """tmp/stacks/my.yaml extends ./base.yaml (beside it), which extends torchtitan with other elementwise passes."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "base.yaml").write_text("id: teambase\nextends: torchtitan\nelementwise_passes: 99.0\n")
    (stacks / "my.yaml").write_text("id: mycluster\nextends: ./base.yaml\nstep_overhead_s: 0.25\n")
    for folder in ("plans", "elsewhere"):
        (tmp_path / folder).mkdir()
    return tmp_path


def _tps(result) -> float:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["throughput"]["tokens_per_sec_per_gpu"]


def test_relative_extends_is_read_beside_the_extending_file(project: Path, monkeypatch):
    monkeypatch.chdir(project / "elsewhere")  # neither ./base.yaml nor stacks/ is here
    mine = load_stack(str(project / "stacks" / "my.yaml"))
    assert (mine.id, mine.elementwise_passes, mine.step_overhead_s) == ("mycluster", 99.0, 0.25)
    assert mine.elementwise_passes != load_stack("torchtitan").elementwise_passes


def test_plan_made_with_a_stack_file_runs_the_same_from_anywhere(project: Path):
    made = run_cli("plan", "--model", "llama3-8b", "--nodes", "1", "--stack", "stacks/my.yaml",
                   "-o", "plans/p.yaml", cwd=project)
    assert made.returncode == 0, made.stderr
    body = yaml.safe_load((project / "plans" / "p.yaml").read_text())
    assert body["stack"] == "stacks/my.yaml"
    assert (body["stack_profile"]["id"], body["stack_profile"]["elementwise_passes"]) == ("mycluster", 99.0)

    here = _tps(run_cli("estimate", "--plan", "plans/p.yaml", "--json", cwd=project))
    shutil.rmtree(project / "stacks")  # the cluster has the plan, not the team's stack files
    there = run_cli("estimate", "--plan", "../plans/p.yaml", "--json", cwd=project / "elsewhere")
    assert _tps(there) == here
    assert json.loads(there.stdout)["stack"] == "mycluster"
    builtin = _tps(run_cli("estimate", "--plan", "plans/p.yaml", "--stack", "torchtitan", "--json", cwd=project))
    assert builtin != here  # the kept profile is what was estimated, not the built-in one

    launch = run_cli("launch", "../plans/p.yaml", "--backend", "slurm", "--dry-run", cwd=project / "elsewhere")
    assert launch.returncode == 0, launch.stderr
    export = run_cli("export", "../plans/p.yaml", "-f", "torchtitan-toml", "-o", "t.toml", cwd=project / "elsewhere")
    assert export.returncode == 0, export.stderr


def test_an_older_plan_reads_its_stack_path_from_its_own_folder(project: Path, monkeypatch):
    """A plan written before plans kept their profile names the file relative to the plan's folder: read it there
    (then from the current folder), and keep it in the copies it is saved to."""
    monkeypatch.chdir(project)
    assert run_cli("plan", "--model", "llama3-8b", "--nodes", "1", "--stack", "../stacks/my.yaml",
                   "-o", "p.yaml", cwd=project / "plans").returncode == 0
    body = yaml.safe_load((project / "plans" / "p.yaml").read_text())
    body.pop("stack_profile")
    (project / "plans" / "old.yaml").write_text(yaml.safe_dump(body, sort_keys=False))

    plan = load_plan(project / "plans" / "old.yaml")  # the current folder is the project, not plans/
    assert plan.stack == "../stacks/my.yaml" and plan.stack_of().id == "mycluster"
    save_plan(plan, project / "elsewhere" / "copy.yaml")
    shutil.rmtree(project / "stacks")
    assert load_plan(project / "elsewhere" / "copy.yaml").stack_of().elementwise_passes == 99.0


def test_an_older_plan_whose_stack_file_is_gone_says_which_in_one_line(project: Path):
    assert run_cli("plan", "--model", "llama3-8b", "--nodes", "1", "--stack", "stacks/my.yaml",
                   "-o", "plans/p.yaml", cwd=project).returncode == 0
    body = yaml.safe_load((project / "plans" / "p.yaml").read_text())
    body.pop("stack_profile")
    body["stack"] = "stacks/gone.yaml"
    (project / "plans" / "old.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    with pytest.raises(MeshplanError, match="gone.yaml"):
        load_plan(project / "plans" / "old.yaml").stack_of()
    out = run_cli("estimate", "--plan", "plans/old.yaml", cwd=project)
    assert out.returncode != 0 and "gone.yaml" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_hardware_extends_reads_a_relative_path_beside_the_extending_file(tmp_path: Path, monkeypatch):
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "base.yaml").write_text("id: ourboard\nextends: h100-sxm\nhbm_bandwidth_tbs: 3.0\n")
    (tmp_path / "hw" / "capped.yaml").write_text("id: ourboard-capped\nextends: base.yaml\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capped = load_hardware("../hw/capped.yaml")
    assert (capped.id, capped.hbm_bandwidth_tbs, capped.hbm_total_gib) == ("ourboard-capped", 3.0, 79.65)


def test_estimate_of_a_plan_under_another_stack_writes_that_stack(project: Path):
    """`estimate --plan P --stack S -o Q`: the plan estimated under S, and Q made with S (its profile kept)."""
    assert run_cli("plan", "--model", "llama3-8b", "--nodes", "1", "-o", "plans/p.yaml", cwd=project).returncode == 0
    own = _tps(run_cli("estimate", "--plan", "plans/p.yaml", "--json", cwd=project))
    other = run_cli("estimate", "--plan", "plans/p.yaml", "--stack", "stacks/my.yaml", "--json", "-o", "plans/q.yaml",
                    cwd=project)
    assert _tps(other) != own
    q = load_plan(project / "plans" / "q.yaml")
    assert (q.stack, q.stack_of().id) == ("stacks/my.yaml", "mycluster")
    assert q.estimate["throughput"]["tokens_per_sec_per_gpu"] == _tps(other)
