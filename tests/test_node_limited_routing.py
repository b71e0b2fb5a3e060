"""Node-limited routing (DeepSeek's n_group / topk_group, torchtitan's num_expert_groups / num_limited_groups): a
token's experts come from its `limited_groups` best of `expert_groups` groups of consecutive experts, so it reaches
fewer EP ranks and nodes (DeepSeek-V3: at most 4 of 8). Read from config.json and the presets, kept by the plan
file (outside the fingerprint), routed by the training core as torchtitan's router does, and timed where it
matters: the deduplicating dispatchers (DeepEP, HybridEP) send a token once per rank and node it reaches."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torchtitan_support import engine

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.physics import moe
from meshplan.estimator.validate import row_inputs
from meshplan.launcher.core.moe import MoE
from meshplan.planner.export._common import preset_of
from meshplan.planner.plan_file import load_plan, make_plan, plan_fingerprint, plan_yaml

H100 = load_hardware("h100-sxm")
TT = load_stack("torchtitan")
DSV3 = load_model("deepseek-v3")
ANYWHERE = DSV3.model_copy(update={"moe": DSV3.moe.model_copy(update={"expert_groups": 1, "limited_groups": None})})


def _core_router(experts: int, top_k: int, groups: int, limited: int) -> MoE:
    """The training core's MoE layer of a tiny model with these experts (only its router is used)."""
    spec = load_model("deepseek-v3-16b").model_copy(update={"hidden": 32, "moe": load_model("deepseek-v3-16b").moe
                                                            .model_copy(update={"experts": experts, "top_k": top_k,
                                                                                "expert_groups": groups,
                                                                                "limited_groups": limited})})
    return MoE(spec)


def _routed(layer: MoE, scores: torch.Tensor) -> torch.Tensor:
    """The expert ids (T, k) the core's router picks from choice scores (T, E)."""
    return torch.topk(layer.limit_groups(scores), layer.top_k, dim=-1).indices


def test_the_preset_and_config_json_say_four_of_eight():
    assert (DSV3.moe.expert_groups, DSV3.moe.limited_groups, DSV3.moe.group_limited) == (8, 4, True)
    for name in ("deepseek-v3-16b", "qwen3-30b-a3b", "mixtral-8x7b"):  # routed anywhere
        assert not load_model(name).moe.group_limited, name
    assert not any("node-limited" in n for n in DSV3.notes)  # modelled now, no longer a caveat


@pytest.mark.parametrize("moe_fields,needle", [
    ({"expert_groups": 6}, "divide the 256 experts"),
    ({"expert_groups": 8}, "needs limited_groups between 1 and 8"),
    ({"expert_groups": 8, "limited_groups": 9}, "between 1 and 8"),
    ({"expert_groups": 128, "limited_groups": 3}, "fewer than top_k"),
    ({"limited_groups": 4}, "needs expert_groups above 1"),
])
def test_impossible_groups_are_one_line_errors(tmp_path, moe_fields, needle):
    p = tmp_path / "bad.yaml"
    moe_ = {"experts": 256, "top_k": 8, "expert_ffn_hidden": 2048, **moe_fields}
    p.write_text(json.dumps({"name": "x", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn_hidden": 128,
                             "vocab": 256, "moe": moe_}))
    with pytest.raises(MeshplanError, match=needle):
        load_model(str(p))


@pytest.mark.parametrize("experts,top_k,groups,limited", [(256, 8, 8, 4), (160, 6, 8, 3)])  # DeepSeek-V3, -V2
def test_the_reach_matches_the_core_router_on_random_scores(experts, top_k, groups, limited):
    """Ranks / nodes a token reaches, by the formula, against the core's router on i.i.d. scores (20k tokens)."""
    torch.manual_seed(0)
    ids = _routed(_core_router(experts, top_k, groups, limited), torch.rand(20_000, experts))
    per_group = experts // groups
    assert max(len(set(row.tolist())) for row in ids // per_group) <= limited  # never beyond the limit
    for units in (2, 4, 8, 16, 32):
        if experts % units:
            continue
        blocks = (ids // (experts // units)).sort(-1).values
        measured = (1 + (blocks[:, 1:] != blocks[:, :-1]).sum(-1)).float().mean().item()
        r = moe._limited_hits(experts, top_k, groups, limited, units)
        assert r == pytest.approx(measured, rel=0.02), units
        assert r <= moe.distinct_groups(experts, top_k, float(units)) + 1e-9  # never more than routed anywhere
    # the layer's own routing (scores + the balancing bias, then the mask, then top-k) keeps to the limit too
    layer = _core_router(experts, top_k, groups, limited)
    layer_ids, _, _ = layer.route(torch.randn(4096, 32))
    assert max(len(set(row.tolist())) for row in layer_ids // per_group) <= limited
    assert max(len(set(row.tolist())) for row in layer_ids // per_group) == limited  # and uses all it may


def test_the_core_routes_as_torchtitan_030_does(tmp_path):
    """The core's group mask against torchtitan 0.3.0's own router method on the same scores, and 0.3.0's 671B
    flavor against the preset."""
    torch.manual_seed(1)
    scores = torch.rand(512, 256)
    ours = _core_router(256, 8, 8, 4).limit_groups(scores)
    src = ("import json, sys, torch, types\n"
           "from torchtitan.models.common.moe import TokenChoiceTopKRouter as R\n"
           "from torchtitan.models.deepseek_v3 import deepseekv3_configs\n"
           "s = torch.load(sys.argv[1])\n"
           "me = types.SimpleNamespace(num_experts=256, num_expert_groups=8, num_limited_groups=4)\n"
           "masked = R._get_node_limited_routing_scores(me, s)\n"
           "torch.save(masked, sys.argv[2])\n"
           "out = {}\n"
           "for flavor in ('16B', '671B'):\n"
           "    r = deepseekv3_configs[flavor](attn_backend='flex', moe_comm_backend='standard').layers[-1].moe.router\n"
           "    out[flavor] = [r.num_expert_groups, r.num_limited_groups]\n"
           "print('GROUPS', json.dumps(out))\n")
    folder = tmp_path
    torch.save(scores, folder / "scores.pt")
    env = {"PYTHONPATH": engine("0.3.0"), "PYTHONNOUSERSITE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", src, str(folder / "scores.pt"), str(folder / "masked.pt")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    theirs = torch.load(folder / "masked.pt")
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs)) and torch.equal(ours, theirs)
    groups = json.loads(out.stdout.split("GROUPS ", 1)[1])
    assert groups["671B"] == [DSV3.moe.expert_groups, DSV3.moe.limited_groups]
    assert groups["16B"] == [None, None] and not load_model("deepseek-v3-16b").moe.group_limited


def _a2a(model, backend: str, **kw) -> float:
    cfg = TrainConfig(gpus=512, dp_shard=64, pp=8, pp_schedule="Interleaved1F1B", ep=64, seq_len=4096,
                      global_batch_size=1024, ac="full", expert_parallel_comm_backend=backend, **kw)
    return estimate(model, H100, cfg, stack=TT)["throughput"]["breakdown_s"]["ep_all_to_all"]


def test_deduplicating_dispatch_sends_to_fewer_nodes():
    # EP 64 = 8 nodes = 8 groups: a token reaches its 4 groups' nodes, not ~5.3 (3.5 remote of 8, not 4.6)
    assert moe._limited_hits(256, 8, 8, 4, 8) == pytest.approx(4.0)
    assert moe.distinct_groups(256, 8, 8.0) == pytest.approx(5.295, abs=1e-3)
    for backend in ("deepep", "hybridep"):
        ratio = _a2a(DSV3, backend) / _a2a(ANYWHERE, backend)
        assert ratio == pytest.approx(4.0 / 5.295, rel=0.03), backend  # the NIC's share bounds the dispatch
    # the standard all-to-all sends a row per expert wherever it is: the limit moves nothing
    assert _a2a(DSV3, "standard") == pytest.approx(_a2a(ANYWHERE, "standard"))
    # round-robin routing (moe_force_load_balance) overrides the group limit, as torchtitan's router does
    assert _a2a(DSV3, "deepep", moe_force_load_balance=True) == \
        pytest.approx(_a2a(ANYWHERE, "deepep", moe_force_load_balance=True))


def test_estimate_json_states_the_limit():
    cfg = TrainConfig(gpus=64, dp_shard=64, ep=64, seq_len=4096, global_batch_size=64, ac="full")
    assert estimate(DSV3, H100, cfg, stack=TT)["model"]["moe"]["limited_groups"] == 4
    assert "limited_groups" not in estimate(ANYWHERE, H100, cfg, stack=TT)["model"]["moe"]


def test_validate_rows_take_the_presets_groups_or_the_columns():
    row = dict(id="r", source="test", framework="megatron-bridge", model="DeepSeek-V3 671B", hardware="h100-sxm",
               gpus="512", dp_shard="64", pp="8", ep="64", seq_len="4096", global_batch_size="1024",
               micro_batch_size="1", precision="bf16", ac="full", layers="61", hidden="7168", heads="128",
               kv_heads="128", ffn_hidden="18432", vocab="129280", experts="256", top_k="8",
               expert_ffn_hidden="2048", shared_ffn_hidden="2048", first_dense_layers="3")
    assert row_inputs(row)[0].moe.limited_groups == 4  # the preset of the same experts
    assert not row_inputs({**row, "expert_groups": "1"})[0].moe.group_limited
    assert row_inputs({**row, "limited_groups": "2"})[0].moe.limited_groups == 2
    assert not row_inputs({**row, "experts": "128"})[0].moe.group_limited  # other experts: not the preset's
    with pytest.raises(MeshplanError, match="row r: .*limited_groups"):
        row_inputs({**row, "limited_groups": "9"})


def test_the_plan_keeps_the_limit_outside_the_fingerprint(tmp_path):
    cfg = TrainConfig(gpus=64, dp_shard=64, ep=64, seq_len=4096, global_batch_size=64, ac="full")
    p = make_plan(DSV3, "deepseek-v3", H100, cfg, steps=10)
    text = plan_yaml(p)
    assert "expert_groups: 8" in text and "limited_groups: 4" in text
    (tmp_path / "p.yaml").write_text(text)
    assert load_plan(tmp_path / "p.yaml").model.moe.limited_groups == 4
    # a plan written before the fields (routed anywhere) keeps its fingerprint and is still torchtitan's 671B
    old = p.model_copy(update={"model": ANYWHERE})
    assert plan_fingerprint(old) == plan_fingerprint(p) and preset_of(old) == "deepseek-v3"
    assert "expert_groups" not in plan_yaml(old)
    q = make_plan(load_model("qwen3-30b-a3b"), "qwen3-30b-a3b", H100, cfg.model_copy(update={"ep": 8}), steps=10)
    assert "expert_groups" not in plan_yaml(q) and "limited_groups" not in plan_yaml(q)


def test_compare_rows_carry_the_limit_back_to_validate():
    from meshplan.launcher.compare import config_row

    cfg = TrainConfig(gpus=64, dp_shard=64, ep=64, seq_len=4096, global_batch_size=64, ac="full")
    row = {"id": "m1", "source": "own run", "framework": "meshplan",
           **config_row(make_plan(DSV3, "deepseek-v3", H100, cfg, steps=10), "h100-sxm")}
    assert (row["expert_groups"], row["limited_groups"]) == (8, 4)
    row = {k: str(v) for k, v in row.items()}
    assert row_inputs({**row, "model": "my-671b"})[0].moe.limited_groups == 4  # from the columns, not a preset
    qwen = config_row(make_plan(load_model("qwen3-30b-a3b"), "qwen3-30b-a3b", H100, cfg.model_copy(update={"ep": 8}),
                                steps=10), "h100-sxm")
    assert "expert_groups" not in qwen and "limited_groups" not in qwen
