"""The terminal UI's session options, driven by Textual's Pilot: `meshplan tui --stack` (a team's own profile,
another framework's), `--ep-comm-backend` (DeepEP, HybridEP) and `--document-tokens` reach every search and the
exported plan."""

from __future__ import annotations

import asyncio

from needs import require_module  # noqa: E402

require_module("textual")

from textual.widgets import Static  # noqa: E402
from tui_pilot import main_screen, settle  # noqa: E402

from meshplan.ui.tui.app import MeshplanApp  # noqa: E402


async def _test_a_stack_profile_of_ones_own(tmp_path):
    """`meshplan tui --stack ./mycluster.yaml`: every search uses the team's profile (the header names it), and the
    plan exported from it keeps that profile, so it estimates the same where the YAML is not."""
    mine = tmp_path / "mycluster.yaml"
    mine.write_text("id: mycluster\nextends: torchtitan\nelementwise_passes: 120.0\n")
    values = {"model": "llama3-8b", "nodes": "1", "seq_len": "4096", "batch": "32", "tokens": ""}
    tps = {}
    for stack in ("torchtitan", str(mine)):
        app = MeshplanApp(values, stack=stack)
        async with app.run_test(size=(120, 34)) as pilot:
            await settle(pilot)
            screen = main_screen(app)
            res = screen.result.res
            assert res.stack.id == ("mycluster" if stack != "torchtitan" else "torchtitan")
            assert ("stack mycluster" in screen.result.describe()) == (stack != "torchtitan")
            tps[stack] = float(res.tps[res.ranked[0]])
            if stack == "torchtitan":
                continue
            await pilot.press("escape", "p", "e")
            out = tmp_path / "exported"
            app.focused.value = str(out)
            await pilot.press("enter")
            await pilot.pause()
    assert tps[str(mine)] < tps["torchtitan"]  # more elementwise passes: a slower estimate
    from meshplan.estimator import estimate
    from meshplan.planner.plan_file import load_plan

    mine.unlink()  # the cluster has the plan, not the team's YAML
    plan = load_plan(next(out.glob("*.yaml")))
    assert plan.stack == str(mine) and plan.stack_of().id == "mycluster"
    est = estimate(plan.model, plan.hardware, plan.train_config(), plan.stack_of())
    assert est["throughput"]["tokens_per_sec_per_gpu"] == plan.estimate["throughput"]["tokens_per_sec_per_gpu"]


def test_a_stack_profile_of_ones_own(tmp_path):
    asyncio.run(_test_a_stack_profile_of_ones_own(tmp_path))


async def _test_deepep_dispatch_for_the_session(tmp_path):
    """`meshplan tui --ep-comm-backend deepep`: the search plans EP layouts with DeepEP (the header says so, the
    layouts with EP are faster than with the standard all-to-all), and the exported plan keeps it, with the
    torchtitan 0.2.2 TOML and without the core's launch scripts, which refuse it."""
    values = {"model": "deepseek-v3-16b", "nodes": "2", "seq_len": "4096", "batch": "64", "tokens": ""}
    tps = {}
    for backend in ("standard", "deepep"):
        app = MeshplanApp(values, ep_backend=backend)
        async with app.run_test(size=(120, 34)) as pilot:
            await settle(pilot)
            screen = main_screen(app)
            res = screen.result.res
            assert ("EP deepep" in screen.result.describe()) == (backend == "deepep")
            tps[backend] = {int(i): float(res.tps[i]) for i in res.ranked if res.configs.ep[i] > 1}
            if backend == "standard":
                continue
            best_ep = max(tps[backend], key=tps[backend].get)
            assert res.config(best_ep)["expert_parallel_comm_backend"] == "deepep"
            # the plans filter keeps the layouts with EP (their label says +deepep); export the best of them
            await pilot.press("escape", "p", "slash", *"+deepep", "enter")
            await pilot.pause()
            assert screen.rows and all(res.configs.ep[i] > 1 for i in screen.rows)
            await pilot.press("e")
            out = tmp_path / "exported"
            app.focused.value = str(out)
            await pilot.press("enter")
            await pilot.pause()
    shared = set(tps["standard"]) & set(tps["deepep"])
    assert shared and all(tps["deepep"][i] > tps["standard"][i] for i in shared)
    from meshplan.planner.plan_file import load_plan

    plan = load_plan(next(out.glob("*.yaml")))
    assert plan.parallel.ep > 1 and plan.parallel.expert_parallel_comm_backend == "deepep"
    assert 'expert_parallel_comm_backend = "deepep"' in next(out.glob("*.toml")).read_text()  # 0.2.2 runs it
    assert not list(out.glob("*-torchrun.sh")) and not list(out.glob("*.sbatch"))  # the core refuses the plan


def test_deepep_dispatch_for_the_session(tmp_path):
    asyncio.run(_test_deepep_dispatch_for_the_session(tmp_path))



async def _test_hybridep_dispatch_for_the_session(tmp_path):
    """`meshplan tui --ep-comm-backend hybridep`: the header says so and the export keeps it in the plan and 0.3's
    config module, and leaves out what would not run it: 0.2.2's TOML (HybridEP came after that release) and the
    core's launch scripts."""
    values = {"model": "deepseek-v3-16b", "nodes": "2", "seq_len": "4096", "batch": "64", "tokens": ""}
    app = MeshplanApp(values, ep_backend="hybridep")
    async with app.run_test(size=(120, 34)) as pilot:
        await settle(pilot)
        screen = main_screen(app)
        assert "EP hybridep" in screen.result.describe()
        # the layouts with EP and rowwise Float8, which 0.3.0 has (it has no tensorwise recipe)
        await pilot.press("escape", "p", "slash", *"+hybridep fp8:row", "enter")
        await pilot.pause()
        res = screen.result.res
        assert screen.rows and all(res.configs.ep[i] > 1 and res.config(int(i))["float8"] == "rowwise"
                                   for i in screen.rows)
        await pilot.press("e")
        out = tmp_path / "exported"
        app.focused.value = str(out)
        await pilot.press("enter")
        await pilot.pause()
    from meshplan.planner.plan_file import load_plan

    plan = load_plan(next(out.glob("*.yaml")))
    assert plan.parallel.ep > 1 and plan.parallel.expert_parallel_comm_backend == "hybridep"
    assert "moe_comm_backend='hybridep'" in (out / "meshplan_job.py").read_text()
    assert not list(out.glob("*.toml"))  # torchtitan 0.2.2 has no HybridEP
    assert not list(out.glob("*-torchrun.sh")) and not list(out.glob("*.sbatch"))  # the core refuses the plan


def test_hybridep_dispatch_for_the_session(tmp_path):
    asyncio.run(_test_hybridep_dispatch_for_the_session(tmp_path))


async def _test_document_tokens_for_the_session(tmp_path):
    """`meshplan tui --document-tokens 2048`: the header says so, FlexAttention's block-causal mask lifts the
    ranked throughput at 32k tokens, and the exported plan keeps the documents' length."""
    values = {"model": "llama3-8b", "nodes": "1", "seq_len": "32768", "batch": "8", "tokens": ""}
    speeds = {}
    for docs in (None, 2048):
        app = MeshplanApp(values, document_tokens=docs)
        async with app.run_test(size=(120, 34)) as pilot:
            await settle(pilot)
            screen = main_screen(app)
            res = screen.result.res
            speeds[docs] = max(float(res.tps[i]) for i in res.ranked)
            assert ("docs ~2,048 tok" in screen.result.describe()) == (docs is not None)
            if docs:
                await pilot.press("escape", "e")
                out = tmp_path / "exported"
                app.focused.value = str(out)
                await pilot.press("enter")
                await pilot.pause()
    from meshplan.planner.plan_file import load_plan

    assert speeds[2048] > 1.5 * speeds[None]
    assert load_plan(next(out.glob("*.yaml"))).training.document_tokens == 2048


def test_document_tokens_for_the_session(tmp_path):
    asyncio.run(_test_document_tokens_for_the_session(tmp_path))


async def _test_another_frameworks_profile(tmp_path):
    """`meshplan tui --stack nanotron`: the search ranks only what nanotron runs (replicas, no compile, no Float8,
    AC none or full), and the export writes the plan and says why it writes no torchtitan job or launch script."""
    values = {"model": "llama3-8b", "nodes": "2", "seq_len": "4096", "batch": "256", "tokens": ""}
    app = MeshplanApp(values, stack="nanotron")
    async with app.run_test(size=(120, 34)) as pilot:
        await settle(pilot)
        screen = main_screen(app)
        res = screen.result.res
        assert "stack nanotron" in screen.result.describe() and len(res.ranked) > 0
        best = res.config(int(res.ranked[0]))
        assert best["dp_shard"] == 1 and not best["compile"] and best["float8"] == "none"
        assert best["ac"] in ("none", "full")
        await pilot.press("escape", "p", "e")
        out = tmp_path / "nanotron-plan"
        app.focused.value = str(out)
        await pilot.press("enter")
        await pilot.pause()
        shown = str(app.screen.query_one("#export-msg", Static).render())
    assert [p.suffix for p in out.iterdir()] == [".yaml"]
    assert "not written: torchtitan-toml" in shown and "estimated for stack nanotron" in shown
    assert shown.count("not written:") == 1 and "mpirun" in shown  # one reason, said once for every format


def test_another_frameworks_profile(tmp_path):
    asyncio.run(_test_another_frameworks_profile(tmp_path))
