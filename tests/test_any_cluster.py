"""Any cluster size: the global batch is a target with a tolerance, degrees come from the world's divisors,
and partial nodes plan through --gpus."""

import json

import numpy as np
import pytest

from meshplan.commands.plan import cluster_shape
from meshplan.estimator import load_hardware, load_model, load_stack
from meshplan.estimator.rules import check
from meshplan.planner.search import plan_search
from meshplan.planner.space import SearchSpace, nearest_batch
from meshplan.planner.tree import decision_tree

TT = load_stack("torchtitan")
H100 = load_hardware("h100-sxm")
L70 = load_model("llama3-70b")


@pytest.mark.parametrize(
    "target, dp, mb, pp, interleaved, tol, expected",
    [
        (512, 8, 1, 1, False, 0.1, 512),  # divides: the target itself
        (512, 24, 1, 1, False, 0.1, 504),  # 504 = 21 x 24 is 8 away, 528 is 16 away
        (512, 6, 1, 1, False, 0.1, 510),  # 510 = 85 x 6 (2 away) beats 516
        (512, 3, 1, 1, False, 0.1, 513),  # 513 = 171 x 3 (1 away) beats 510
        (512, 40, 1, 1, False, 0.1, 520),  # 520 (8 away) beats 480 (32 away)
        (512, 24, 1, 1, False, 0.0, 512),  # exact asked: nothing divides, the target stays (the rules reject it)
        (64, 48, 1, 1, False, 0.1, 64),  # 48 and 96 are both outside 57.6..70.4: the target stays
        (4, 1, 1, 4, False, 0.5, 4),  # pp 4 fills with 4 microbatches
        (3, 1, 1, 4, False, 0.5, 4),  # 3 cannot fill pp 4; 4 is within +50 %
        (10, 1, 1, 4, True, 0.1, 10),  # interleaved: 10 microbatches in rounds of 2 are whole
    ],
)
def test_nearest_batch_by_hand(target, dp, mb, pp, interleaved, tol, expected):
    assert nearest_batch(target, dp, mb, pp, interleaved, tol) == expected


def test_interleaved_batch_takes_whole_rounds():
    # pp 4, 14 microbatches: rounds of max(1, 14 // 4) = 3 do not divide 14; 15 (rounds of 3) does, 1 away;
    # 13 (rounds of 3) does not, so the nearest that runs is 15 (tie-break to the smaller never applies here)
    assert nearest_batch(14, 1, 1, 4, True, 0.2) == 15
    assert nearest_batch(14, 1, 1, 4, False, 0.2) == 14


@pytest.mark.parametrize("nodes", [3, 6, 12, 24])
def test_70b_plans_on_clusters_that_are_not_powers_of_two(nodes):
    res = plan_search(L70, H100, TT, nodes * 8, 8, 8192, 512, space=SearchSpace(compile=[True], async_tp=[False]))
    assert len(res.ranked) > 0, f"no 70B plan on {nodes} nodes"
    for i in res.ranked[:20]:
        cfg = res.config(int(i))
        dp = cfg["dp_replicate"] * cfg["dp_shard"]
        assert dp * cfg["cp"] * cfg["tp"] * cfg["pp"] == nodes * 8
        gb = cfg["global_batch_size"]
        assert gb % (dp * cfg["micro_batch_size"]) == 0 and abs(gb - 512) <= 51
        assert check(L70, H100, cfg) is None  # the estimator's and the core's rules accept the moved batch


def test_pp_and_hsdp_degrees_that_are_not_powers_of_two():
    # 5 nodes: the issue's --pp 5 --tp 8 layout is searched; with no GPU left for FSDP torchtitan 0.2.2 would train it
    # in fp32 (its mixed precision came from FSDP), so it is predicted but not ranked, and the reason says so
    old = load_stack("torchtitan-2026-03")
    res = plan_search(L70, H100, old, 40, 8, 8192, 512, space=SearchSpace(tp=[8], pp=[5], compile=[True]))
    assert len(res.ranked) == 0 and res.reason_counts().get("fp32_without_fsdp", 0) > 0
    # the current release wraps FSDP2 with one shard there and trains it in bf16: ranked, none refused for fp32
    res = plan_search(L70, H100, TT, 40, 8, 8192, 512, space=SearchSpace(tp=[8], pp=[5], compile=[True]))
    assert len(res.ranked) > 0 and res.reason_counts().get("fp32_without_fsdp", 0) == 0
    assert {res.config(int(i))["dp_shard"] for i in res.ranked} == {1}
    # 10 nodes: pp 5 x tp 8 x dp_shard 2 (80 layers + embedding and output in 5 stages) is ranked
    res = plan_search(L70, H100, TT, 80, 8, 8192, 512, space=SearchSpace(tp=[8], pp=[5], compile=[True]))
    assert len(res.ranked) > 0
    cfg = res.config(int(res.ranked[0]))
    assert (cfg["tp"], cfg["pp"], cfg["dp_shard"]) == (8, 5, 2)
    assert cfg["global_batch_size"] >= 5 * cfg["micro_batch_size"]
    # 3 nodes of 8: HSDP with one replica per node (3 x 8) is a candidate
    res3 = plan_search(load_model("llama3-8b"), H100, TT, 24, 8, 8192, 512, space=SearchSpace(tp=[1], pp=[1], cp=[1]))
    c = res3.configs
    assert ((c.dp_replicate == 3) & (c.dp_shard == 8)).any()


def test_exact_batch_reproduces_the_old_rejection():
    res = plan_search(L70, H100, TT, 24, 8, 8192, 512, space=SearchSpace(batch_tolerance=0.0))
    assert len(res.ranked) == 0 or all(res.config(int(i))["global_batch_size"] == 512 for i in res.ranked)
    assert res.reason_counts().get("batch_divides", 0) > 0


def test_power_of_two_clusters_keep_the_target():
    res = plan_search(L70, H100, TT, 64, 8, 8192, 512, space=SearchSpace(compile=[True]))
    assert np.all(res.configs.global_batch[res.ranked] == 512)


def test_tree_says_why_the_batch_moved():
    res = plan_search(L70, H100, TT, 24, 8, 8192, 512, space=SearchSpace(compile=[True], async_tp=[False]))
    ac = decision_tree(res)[-1]
    gb = res.config(int(res.ranked[0]))["global_batch_size"]
    assert gb != 512 and f"global batch is {gb:,} sequences, not the 512 asked for" in ac["reason"]


@pytest.mark.parametrize("gpus, shape", [(4, (1, 4)), (8, (1, 8)), (12, (2, 6)), (20, (4, 5)), (24, (3, 8)),
                                         (13, (13, 1))])
def test_cluster_shape(gpus, shape):
    assert cluster_shape(gpus, 8) == shape


def test_plan_cli_on_3_nodes_and_partial_nodes(cli, tmp_path):
    out = tmp_path / "p.yaml"
    r = cli("plan", "--model", "llama3-70b", "--nodes", "3", "--json", "-o", str(out))
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["plans"][0]["config"]
    assert best["gpus"] == 24 and best["global_batch_size"] != 512
    assert f"global_batch_size: {best['global_batch_size']}" in out.read_text()
    r = cli("plan", "--model", "llama3-8b", "--gpus", "12", "--top", "2")
    assert r.returncode == 0, r.stderr
    assert "2 x 6 h100-sxm" in r.stdout and "batch" in r.stdout
    r = cli("plan", "--model", "llama3-8b", "--nodes", "3", "--batch-tolerance", "0", "--json")
    assert r.returncode == 0, r.stderr  # 512 divides into dp 8 x ... on 24 GPUs with tp/cp/pp
    assert all(p["config"]["global_batch_size"] == 512 for p in json.loads(r.stdout)["plans"])
    r = cli("plan", "--model", "llama3-8b", "--batch-tolerance", "1.5")
    assert r.returncode != 0 and "Traceback" not in r.stderr and "--batch-tolerance" in r.stderr


def test_plan_that_fits_nowhere_says_how_many_nodes_it_takes(cli):
    r = cli("plan", "--model", "llama3-70b", "--nodes", "2")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "no configuration of llama3-70b fits on 16 x h100-sxm" in r.stderr
    assert "it fits from 3 nodes (24 GPUs): dp 1x6" in r.stderr
