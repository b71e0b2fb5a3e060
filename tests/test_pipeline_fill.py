"""Pipelines with fewer microbatches than stages: frameworks run them (torchtitan warns; torch's GPipe and
Interleaved1F1B accept them, its Schedule1F1B refuses), so the estimator predicts them and only the planner's
ranking rejects them, with the reason. The bubble is checked against torch's own interleaved schedule."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from meshplan.estimator import rules
from meshplan.estimator.physics.layout import layout_of
from meshplan.estimator.physics.pipeline import bubble_s

T_FWD, T_BWD = 1.0, 2.0  # a chunk's forward and backward, in the same time unit


def torch_actions(schedule: type, p: int, v: int, m: int) -> dict[int, list]:
    """Each rank's actions (forward, full / input / weight backward of a chunk and microbatch) in the order torch's
    looped `schedule` computes them for pp `p`, vpp `v` and `m` microbatches (its bubbles left out)."""
    fake = SimpleNamespace(n_local_stages=v, pp_group_size=p, _n_microbatches=m,
                           microbatches_per_round=m // max(1, m // p))
    return {r: [a for a in schedule._calculate_single_rank_operations(fake, r) if a is not None] for r in range(p)}


def replay(schedule: type, p: int, v: int, m: int, f: float = T_FWD, i: float = T_BWD, w: float = 0.0) -> float:
    """The step length of a torch.distributed.pipelining looped schedule (its own per-rank action order; vpp = 1
    is plain 1F1B's order) when each action starts as soon as its rank is free and its input arrived: forwards take
    `f`, input gradients `i`, weight gradients `w` (a full backward i + w). Waits the schedule inserts as bubbles
    the replay finds by itself."""
    from torch.distributed.pipelining.schedules import _ComputationType as Op

    ops = torch_actions(schedule, p, v, m)
    stages, done, free, nxt = p * v, {}, [0.0] * p, [0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while nxt[r] < len(ops[r]):
                a = ops[r][nxt[r]]
                s, mb, kind = a.stage_index, a.microbatch_index, a.computation_type
                if kind == Op.FORWARD:
                    key, dur, deps = ("F", s, mb), f, [("F", s - 1, mb)] if s else []
                elif kind in (Op.FULL_BACKWARD, Op.BACKWARD_INPUT):
                    key, dur = ("I", s, mb), i + (w if kind == Op.FULL_BACKWARD else 0.0)
                    deps = [("I", s + 1, mb)] if s < stages - 1 else [("F", s, mb)]
                else:
                    assert kind == Op.BACKWARD_WEIGHT, kind
                    key, dur, deps = ("W", s, mb), w, [("I", s, mb)]
                if any(d not in done for d in deps):
                    break
                done[key] = free[r] = max([free[r]] + [done[d] for d in deps]) + dur
                nxt[r] += 1
                moved = True
    assert all(nxt[r] == len(ops[r]) for r in range(p)), "the simulated schedule deadlocked"
    return max(free)


def torch_makespan(p: int, v: int, m: int) -> float:
    """The step length of torch's ScheduleInterleaved1F1B (`replay`)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    return replay(ScheduleInterleaved1F1B, p, v, m)


def torch_zero_bubble_makespan(p: int, v: int, m: int, f: float, i: float, w: float) -> float:
    """The step length of torch's ScheduleInterleavedZeroBubble (ZB1P; `replay`)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble

    return replay(ScheduleInterleavedZeroBubble, p, v, m, f, i, w)


def peak_in_flight(schedule: type, p: int, v: int, m: int) -> list[tuple[int, int]]:
    """Per rank of torch's looped `schedule`: the most chunk-microbatches forwarded and not yet through their input
    gradient (a full backward for interleaved 1F1B), and not yet through their weight gradient, in its action order."""
    from torch.distributed.pipelining.schedules import _ComputationType as Op

    out = []
    for actions in torch_actions(schedule, p, v, m).values():
        to_input = to_weight = most_input = most_weight = 0
        for a in actions:
            kind = a.computation_type
            to_input += 1 if kind == Op.FORWARD else -1 if kind in (Op.FULL_BACKWARD, Op.BACKWARD_INPUT) else 0
            to_weight += 1 if kind == Op.FORWARD else -1 if kind in (Op.FULL_BACKWARD, Op.BACKWARD_WEIGHT) else 0
            most_input, most_weight = max(most_input, to_input), max(most_weight, to_weight)
        out.append((most_input, most_weight))
    return out


def layout(pp: int, vpp: int, microbatches: int, schedule: str):
    return layout_of(rules.arrays_of({"pp": pp, "vpp": vpp, "pp_schedule": schedule, "seq_len": 1024,
                                      "global_batch_size": microbatches, "micro_batch_size": 1,
                                      "dp_shard": 1}))


CASES = [(p, v, m) for p, v in ((4, 2), (4, 3), (8, 2), (2, 4)) for m in (1, 2, 3, 4, 8)
         if m <= p or m % p == 0]  # torch runs whole rounds of pp microbatches


@pytest.mark.parametrize("p,v,m", CASES)
def test_interleaved_bubble_matches_torchs_schedule(p, v, m):
    lay = layout(p, v, m, "Interleaved1F1B")
    t_mb = v * (T_FWD + T_BWD)  # one microbatch through all of a rank's chunks
    idle = torch_makespan(p, v, m) - m * t_mb
    assert float(bubble_s(lay, np.array([t_mb]))[0]) == pytest.approx(idle), (p, v, m)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_single_chunk_bubble_is_pp_minus_one_microbatch_times(m):
    lay = layout(4, 1, m, "GPipe")
    idle = torch_makespan(4, 1, m) - m * (T_FWD + T_BWD)
    assert float(bubble_s(lay, np.array([T_FWD + T_BWD]))[0]) == pytest.approx(idle)


def test_estimate_predicts_an_unfilled_pipeline_and_says_why_it_is_slow(cli):
    def est(gbs: int, schedule: str) -> dict:
        out = cli("estimate", "--gpus", "16", "--pp", "4", "--pp-schedule", schedule, "--global-batch-size",
                  str(gbs), "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    few, full = est(8, "GPipe"), est(32, "GPipe")  # dp 4: 2 and 8 microbatches for 4 stages
    assert few["throughput"]["microbatches"] == 2
    fill = [w for w in few["warnings"] if "cannot fill" in w]
    assert len(fill) == 1 and "the bubble is" in fill[0]
    bubble = few["throughput"]["breakdown_s"]["pp_bubble"] / few["throughput"]["step_time_s"]
    assert bubble > 0.5  # 3 idle microbatch times of 5
    assert few["throughput"]["tokens_per_sec_per_gpu"] < 0.7 * full["throughput"]["tokens_per_sec_per_gpu"]
    assert not any("cannot fill" in w for w in full["warnings"])
    one_f = est(8, "1F1B")  # predicted too, with torch's refusal said
    assert any("Schedule1F1B refuses" in w for w in one_f["warnings"])


def test_only_runnable_schedules_pass_the_plan_and_core_rules():
    from meshplan.estimator import load_model

    model = load_model("llama3-8b")
    base = {"pp": 4, "dp_shard": 2, "seq_len": 8192, "global_batch_size": 4, "micro_batch_size": 1,
            "gpus_per_node": 8}
    assert rules.check(model, None, {**base, "pp_schedule": "GPipe"}) is None
    assert rules.check(model, None, {**base, "pp_schedule": "Interleaved1F1B", "vpp": 2}) is None
    assert "Schedule1F1B refuses" in rules.check(model, None, {**base, "pp_schedule": "1F1B"})
    assert rules.check(model, None, {**base, "pp_schedule": "1F1B"}, predict=True) is None
    # the planner's ranking rejects all three, naming the pipeline that cannot fill
    for sched, vpp in (("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2)):
        c = rules.arrays_of({**base, "pp_schedule": sched, "vpp": vpp})
        code = int(rules.violations(model, c, None, planner=True))
        assert rules.BY_CODE[code].key == "pp_microbatches", sched


def test_validate_predicts_a_row_with_fewer_microbatches_than_stages(tmp_path, cli, ground_truth):
    header, first = ground_truth.read_text().splitlines()[:2]
    cols = header.split(",")
    row = dict(zip(cols, first.split(",")[: len(cols)], strict=False))
    # Llama 3.1 8B on 16 GPUs: pp 4 x dp 4, 8 sequences of 1: 2 microbatches for 4 stages
    row.update(id="fill", gpus="16", dp_shard="4", pp="4", pp_schedule="1F1B", global_batch_size="8",
               micro_batch_size="1", notes="", source="test")
    path = tmp_path / "runs.csv"
    path.write_text(header + "\n" + ",".join(row.get(c, "") for c in cols) + "\n")
    out = cli("validate", str(path), "--json")
    assert out.returncode == 0, out.stderr
    (r,) = json.loads(out.stdout)["rows"]
    assert r["error"] is None and r["predicted_tps_per_gpu"] > 0, r



FIW = [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0)]  # a chunk's F, I and W


@pytest.mark.parametrize("p,v,m", [(p, v, m) for p, v, m in CASES if m >= p])
@pytest.mark.parametrize("fiw", FIW)
def test_zero_bubble_bubble_matches_torchs_schedule(p, v, m, fiw):
    """ZB1P's (pp - 1)(F + B - 2W) is torch's interleaved zero-bubble schedule's idle time, for unequal F, I, W."""
    f, i, w = fiw
    lay = layout(p, v, m, "InterleavedZeroBubble")
    t_mb = v * (f + i + w)
    idle = torch_zero_bubble_makespan(p, v, m, f, i, w) - m * t_mb
    assert float(bubble_s(lay, np.array([t_mb]), np.array([v * w]))[0]) == pytest.approx(idle), (p, v, m)
    # and less than interleaved 1F1B's, by 2W a slot
    one_f = float(bubble_s(layout(p, v, m, "Interleaved1F1B"), np.array([t_mb]))[0])
    assert idle == pytest.approx(one_f - 2 * w * (p - 1))


@pytest.mark.parametrize("p,v,m", [(p, v, m) for p, v, m in CASES if m < p])
def test_an_unfilled_zero_bubble_pipeline_is_predicted_within_a_third(p, v, m):
    """Fewer microbatches than stages: torch's order inserts waits the closed form only approximates."""
    f, i, w = 1.0, 1.0, 1.0
    lay = layout(p, v, m, "InterleavedZeroBubble")
    t_mb = v * (f + i + w)
    makespan = torch_zero_bubble_makespan(p, v, m, f, i, w)
    predicted = m * t_mb + float(bubble_s(lay, np.array([t_mb]), np.array([v * w]))[0])
    assert predicted == pytest.approx(makespan, rel=0.34), (p, v, m)


def test_zero_bubble_runs_eager_blocks_only_and_its_estimate_is_faster_than_interleaved(cli):
    def est(*args: str) -> dict:
        out = cli("estimate", "--model", "llama3-70b", "--gpus", "32", "--tp", "8", "--pp", "4", "--no-compile",
                  "--json", *args)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    zb, il = est("--pp-schedule", "InterleavedZeroBubble"), est("--pp-schedule", "Interleaved1F1B")
    assert zb["config"]["vpp"] == il["config"]["vpp"] == 2  # torchtitan's default for a looped schedule
    assert 0 < zb["throughput"]["breakdown_s"]["pp_bubble"] < il["throughput"]["breakdown_s"]["pp_bubble"]
    assert zb["throughput"]["tokens_per_sec_per_gpu"] > il["throughput"]["tokens_per_sec_per_gpu"]
    # fewer microbatches in flight on the first stage, the weight gradients' inputs held longer on the others
    assert abs(zb["memory"]["peak_gib"] / il["memory"]["peak_gib"] - 1) < 0.1
    out = cli("estimate", "--model", "llama3-70b", "--gpus", "32", "--tp", "8", "--pp", "4", "--compile",
              "--pp-schedule", "InterleavedZeroBubble")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "InterleavedZeroBubble splits each backward" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_the_planner_searches_zero_bubble_where_the_framework_runs_it(cli):
    """torchtitan's search holds InterleavedZeroBubble (its compiled variants rejected, saying why); nanotron's,
    whose profile runs GPipe and 1F1B alone, does not."""
    out = cli("plan", "--model", "llama3-70b", "--gpus", "32", "--pp", "4", "--top", "400", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["rejected_by_reason"]["zero_bubble_compile"] > 0
    eager = [p["config"] for p in got["plans"] if not p["config"]["compile"]]
    assert any(c["pp_schedule"] == "InterleavedZeroBubble" and c["vpp"] >= 2 for c in eager)
    out = cli("plan", "--model", "llama3-8b", "--gpus", "16", "--pp", "2", "--stack", "nanotron", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert "zero_bubble_compile" not in got["rejected_by_reason"]
    assert {p["config"]["pp_schedule"] for p in got["plans"]} <= {"GPipe", "1F1B"}


def test_validate_reads_torchs_zero_bubble_schedule_name():
    from meshplan.estimator.validate import pp_schedule_name

    assert pp_schedule_name("ScheduleInterleavedZeroBubble") == "InterleavedZeroBubble"
    assert pp_schedule_name("ZB1P") == "InterleavedZeroBubble"


def test_plan_pins_the_schedule_stages_and_compile(cli):
    """`meshplan plan --pp-schedule --vpp --compile` search only those; a value the framework does not run, or no
    schedule at all, is a one-line error."""
    out = cli("plan", "--model", "llama3-70b", "--gpus", "32", "--pp", "4", "--pp-schedule", "InterleavedZeroBubble",
              "--vpp", "2", "--compile", "off", "--top", "20", "--json")
    assert out.returncode == 0, out.stderr
    configs = [p["config"] for p in json.loads(out.stdout)["plans"]]
    assert configs and all(c["pp_schedule"] == "InterleavedZeroBubble" and c["vpp"] == 2 and not c["compile"]
                           for c in configs)
    for args, needle in ((("--pp-schedule", "ZBV"), "--pp-schedule takes a comma-separated list of GPipe"),
                         (("--compile", "maybe"), "--compile takes a comma-separated list of on, off"),
                         (("--stack", "nanotron", "--pp-schedule", "InterleavedZeroBubble"),
                          "stack nanotron does not run the InterleavedZeroBubble pipeline schedule")):
        out = cli("plan", "--model", "llama3-8b", "--gpus", "16", *args)
        assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr, out.stderr


IN_FLIGHT = [(p, v, m) for p in (2, 3, 4, 8) for v in (2, 3, 4) for m in range(1, 3 * p + 1) if m <= p or m % p == 0]


@pytest.mark.parametrize("p,v,m", IN_FLIGHT)
def test_microbatches_in_flight_are_torchs_own(p, v, m):
    """The activations each rank holds at its peak, as torch's looped schedules order their actions: interleaved
    1F1B's forwards not yet through their backward; the zero bubble's not yet through their weight gradient (their
    linears' inputs stay until then: counted whole, an upper bound)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble

    from meshplan.estimator.physics.pipeline import microbatches_in_flight

    for schedule, name, pick in ((ScheduleInterleaved1F1B, "Interleaved1F1B", 0),
                                 (ScheduleInterleavedZeroBubble, "InterleavedZeroBubble", 1)):
        lay = layout(p, v, m, name)
        torch_peaks = [peak[pick] for peak in peak_in_flight(schedule, p, v, m)]
        ours = [float(microbatches_in_flight(lay, np.array([float(k)]))[0]) * v for k in range(p)]
        assert ours == pytest.approx(torch_peaks), (name, p, v, m)
