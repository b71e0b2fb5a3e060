"""Run integrity through the real entry point under torchrun (2 ranks, gloo): damaged pointers and shards never
cost an intact checkpoint, a run dir belongs to one plan, a non-finite loss stops the run without exit 0."""

from __future__ import annotations

import shutil

import pytest
from launchtools import config, losses_by_step, read_metrics, train

pytestmark = pytest.mark.slow


def cfg(run_dir, **overrides):
    return config(run_dir, **{"steps": 6, "checkpoint_interval": 2, "keep_checkpoints": 3, "resume": True,
                              "dp_shard": 2, "fingerprint": "aaaaaaaa11111111", **overrides})


def steps_on_disk(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 6-step run with checkpoints at steps 2, 4 and 6; copied per test."""
    tmp = tmp_path_factory.mktemp("integrity")
    proc = train(2, cfg(tmp / "run"), tmp / "run.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert steps_on_disk(tmp / "run") == ["step-00000002", "step-00000004", "step-00000006"]
    return tmp / "run"


def copy_run(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def flip_bytes(path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("pointer", ["", "step-00000099", "../../elsewhere", "garbage\x00"])
def test_damaged_pointer_falls_back_to_the_newest_intact_checkpoint(trained, tmp_path, pointer):
    run = copy_run(trained, tmp_path)
    (run / "checkpoints" / "latest").write_text(pointer)
    proc = train(2, cfg(run, steps=8), tmp_path / "c.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resumed from" in proc.stdout and "step-00000006 at step 6" in proc.stdout
    assert "'latest' pointer" in proc.stderr
    assert steps_on_disk(run) == ["step-00000004", "step-00000006", "step-00000008"]


def test_step_without_metadata_or_with_a_damaged_shard_is_skipped_and_kept(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    ckpts = run / "checkpoints"
    (ckpts / "step-00000006" / ".metadata").unlink()
    flip_bytes(next((ckpts / "step-00000004").glob("*.distcp")))
    proc = train(2, cfg(run, steps=8), tmp_path / "c.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "step-00000002 at step 2" in proc.stdout, proc.stdout
    assert "does not match its checksum" in proc.stderr and ".metadata" in proc.stderr
    # the metrics of the steps run again are not counted twice
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 9))
    assert "step-00000008" in steps_on_disk(run)


def test_no_intact_checkpoint_fails_loudly_and_deletes_nothing(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    for step in steps_on_disk(run):
        flip_bytes(next((run / "checkpoints" / step).glob("*.distcp")))
    before = steps_on_disk(run)
    proc = train(2, cfg(run, steps=8), tmp_path / "c.json")
    assert proc.returncode != 0
    assert "no intact checkpoint" in proc.stderr
    assert steps_on_disk(run) == before


def test_another_plan_cannot_resume_the_run_dir(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    proc = train(2, cfg(run, steps=8, fingerprint="bbbbbbbb22222222"), tmp_path / "c.json")
    assert proc.returncode != 0
    assert "belongs to another plan (fingerprint aaaaaaaa11111111, this plan bbbbbbbb22222222)" in proc.stderr
    assert steps_on_disk(run) == ["step-00000002", "step-00000004", "step-00000006"]


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    run = tmp_path / "run"
    proc = train(2, cfg(run, lr=1e30, warmup_steps=0, checkpoint_interval=1, steps=6), tmp_path / "c.json")
    assert proc.returncode != 0
    assert "not finite" in proc.stderr and "the last good checkpoint is kept" in proc.stderr
    last_good = max(losses_by_step(run))  # the non-finite step is not logged
    assert steps_on_disk(run), "the checkpoints before the bad step are kept"
    assert max(int(s.split("-")[1]) for s in steps_on_disk(run)) == last_good


def test_a_finished_run_says_there_is_nothing_to_train(trained, tmp_path):
    run = copy_run(trained, tmp_path)
    proc = train(2, cfg(run), tmp_path / "c.json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "nothing to train" in proc.stdout and "already holds step 6 of 6" in proc.stdout
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 7))
