"""The configuration contract: every plan the planner ranks is one the plan file, the training core's own
validation (`launcher.core.config.RunConfig`) and the exported torchtitan job accept."""

from __future__ import annotations

import pytest

from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import load_model
from meshplan.estimator.stack import load_stack
from meshplan.launcher.core.config import RunConfig
from meshplan.launcher.plan_run import run_config_fields
from meshplan.planner.export import render
from meshplan.planner.export._common import preset_of
from meshplan.planner.plan_file import Plan, make_plan
from meshplan.planner.search import plan_search

TOP = 50
TOKENS_PER_STEP = 4 * 1024 * 1024
SEARCHES = [  # (model, nodes, hardware, seq_len)
    ("llama3-405b", 64, "h100-sxm", 8192),
    ("llama3-70b", 8, "h100-sxm", 8192),
    ("llama3-8b", 2, "h100-sxm", 8192),
    ("llama3-70b", 8, "h200-sxm", 8192),
    ("llama3-70b", 4, "b200", 8192),
    ("llama3-8b", 1, "b200", 4096),
    ("llama3-405b", 16, "h200-sxm", 4096),
    # attention wider than the stream (64 heads of 128 over 5120, QK-norm): the core builds it from the plan
    ("qwen3-32b", 4, "h100-sxm", 4096),
    # mixture of experts: expert parallelism in the search (the core's MoE block, torchtitan's flavors)
    ("deepseek-v3-16b", 2, "h100-sxm", 4096),
    ("qwen3-235b-a22b", 16, "h100-sxm", 4096),
    ("deepseek-v3", 64, "h100-sxm", 4096),
    # a MoE model with no torchtitan flavor meshplan maps (gpt-oss: biased attention, sliding windows): the core
    # and the torchrun launch take its plans
    ("gpt-oss-20b", 1, "h100-sxm", 4096),
]


def top_plans(model_name: str, nodes: int, hardware: str, seq_len: int) -> list[Plan]:
    model, hw, stack = load_model(model_name), load_hardware(hardware), load_stack("torchtitan")
    gpn = hw.gpus_per_node
    res = plan_search(model, hw, stack, nodes * gpn, gpn, seq_len, TOKENS_PER_STEP // seq_len)
    assert len(res.ranked) >= 1, f"nothing fits for {model_name} on {nodes} x {hardware}"
    return [make_plan(model, model_name, hw, res.train_config(int(i))) for i in res.ranked[:TOP]]


@pytest.mark.parametrize("search", SEARCHES, ids=lambda s: f"{s[0]}-{s[1]}n-{s[2]}")
def test_top_plans_pass_the_core_and_export(search):
    plans = top_plans(*search)
    refused = []
    for rank, plan in enumerate(plans, 1):
        Plan.model_validate(plan.model_dump())  # the plan file reads back
        try:
            cfg = RunConfig.from_dict(run_config_fields(plan, "/tmp/unused", device="cuda"))
        except ValueError as exc:
            refused.append(f"#{rank}: {exc}")
            continue
        assert cfg.world_size == plan.cluster.gpus and cfg.ep == plan.parallel.ep
        # the exporter takes it (real parsers: test_torchtitan_real); 0.2.2 has no Qwen3 pipeline, and runs DDP only
        # as the whole mesh (these plans are the current release's, which replicates beside TP / PP through FSDP2):
        # 0.3.0's command line
        p = plan.parallel
        qwen3_pp = plan.model.name.startswith("qwen3") and p.pp > 1
        ddp_beside = p.dp_replicate > 1 and p.dp_shard * p.cp == 1 and p.tp * p.pp > 1
        titan = preset_of(plan) is not None
        render(plan, "torchrun" if not titan else "torchtitan-cli" if qwen3_pp or ddp_beside else "torchtitan-toml",
               "p.yaml")
    assert not refused, "\n".join(refused)


def test_large_moe_models_rank_expert_parallel_plans():
    """DeepSeek-V3 on 64 nodes fits only with EP (its experts are 98 % of the parameters), and the planner's top
    plans use it."""
    plans = top_plans("deepseek-v3", 64, "h100-sxm", 4096)
    assert all(p.parallel.ep > 1 for p in plans[:10])


def test_float8_tp_plans_are_ranked_and_accepted():
    """405B on 64 nodes ranks Float8 with TP first; the core takes it (torchao float8 TP styles)."""
    plans = top_plans("llama3-405b", 64, "h100-sxm", 8192)
    first = plans[0].parallel
    assert first.tp > 1 and first.float8 != "none", first
    RunConfig.from_dict(run_config_fields(plans[0], "/tmp/unused", device="cuda"))


def test_async_tp_without_compile_is_never_ranked():
    model, hw, stack = load_model("llama3-70b"), load_hardware("h100-sxm"), load_stack("torchtitan")
    res = plan_search(model, hw, stack, 64, 8, 8192, 512)
    c = res.configs
    bad = (c.async_tp > 0) & (c.compile == 0)
    assert bad.any() and (res.reason[bad] != 0).all()
    assert "async_tp_compile" in res.reason_counts()


@pytest.mark.parametrize("model, nodes", [("llama3-405b", 64), ("llama3-70b", 8), ("llama3-8b", 2)])
def test_planned_plan_dry_runs_to_cuda_in_its_run_dir(cli, tmp_path, model, nodes):
    """`meshplan plan -o` then `meshplan launch --dry-run`: the core validates it, and every backend's script
    sends the core to cuda/NCCL in the run dir it names, with the interpreter meshplan was installed with."""
    import json
    import sys

    plan = tmp_path / "plan.yaml"
    out = cli("plan", "--model", model, "--nodes", str(nodes), "-o", str(plan), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for backend in ("slurm", "torchrun", "mpirun", "local"):
        out = cli("launch", str(plan), "--dry-run", "--json", "--backend", backend, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        run = json.loads(out.stdout)
        assert run["device"] == "cuda" and run["process_group"] == "nccl" and run["world"] == nodes * 8
        assert run["run_dir"].startswith(str(tmp_path / "runs")) and run["fingerprint"][:8] in run["run_dir"]
        text = run["script"] if backend != "local" else " ".join(run["command"])
        assert "cuda" in text and run["run_dir"] in text and "meshplan.launcher.run_plan" in text
        assert sys.executable in text
        if backend == "slurm":
            assert "#SBATCH --gpus-per-node=8" in text


def test_a_plan_file_the_core_would_refuse_is_refused_by_dry_run(cli, tmp_path):
    """A hand-edited plan (async TP without compile) fails `meshplan launch --dry-run` in one line, exit 2."""
    plan = top_plans("llama3-70b", 8, "h100-sxm", 8192)[0]
    bad = plan.model_dump(mode="json")
    bad["parallel"].update(tp=8, dp_shard=plan.parallel.dp_shard * plan.parallel.tp // 8, async_tp=True,
                           compile=False)
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    out = cli("launch", str(path), "--dry-run", "--backend", "slurm", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "async TP is a torch.compile pass: it needs compile on" in out.stderr
    assert not (tmp_path / "runs").exists()
