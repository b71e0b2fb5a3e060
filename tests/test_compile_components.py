"""torchtitan's compile.components (model, loss): what compile compiles, in the estimate, the rules, `validate`'s
column, the plan file, the CLI and the exports. The core's side is tests/launcher/test_core_semantics.py; the
releases' own parsers read the exports in tests/test_torchtitan_real.py-style probes below (slow)."""

from __future__ import annotations

import pytest
from cli_runner import run_cli
from torchtitan_support import CC, plan, probe

from meshplan.estimator import MeshplanError, TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.validate import validate_rows
from meshplan.planner.export import render, torchtitan_train_argv
from meshplan.planner.export.torchtitan_cli import cli_overrides
from meshplan.planner.plan_file import load_plan, make_plan, plan_fingerprint, plan_yaml

H96 = load_hardware("h100-96g-500w")
DS16 = load_model("deepseek-v3-16b")
TT = load_stack("torchtitan-2025-08")
# torchtitan PR #1610's DeepSeek-V3 16B run: deepseek_v3_16b.toml (compile.enable, components ["loss"]) with EP 8
ROW = dict(gpus=8, dp_shard=8, ep=8, seq_len=4096, global_batch_size=64, micro_batch_size=8, ac="selective")


def _est(**kw) -> dict:
    return estimate(DS16, H96, TrainConfig(**ROW, **kw), stack=TT)


def test_loss_only_compiles_the_loss_and_leaves_the_blocks_eager():
    off, both = _est(compile=False), _est(compile=True)
    loss = _est(compile=True, compile_components=("loss",))
    model = _est(compile=True, compile_components=("model",))
    b = {k: r["memory"]["breakdown_gib"] for k, r in (("off", off), ("both", both), ("loss", loss), ("model", model))}
    # the compiled loss keeps no fp32 copy of the logits: a third of the eager loss's buffers here (6 -> 2 bf16 sizes)
    assert b["loss"]["logits_loss"] == pytest.approx(b["both"]["logits_loss"])
    assert b["loss"]["logits_loss"] < 0.5 * b["off"]["logits_loss"]
    assert b["model"]["logits_loss"] == pytest.approx(b["off"]["logits_loss"])
    # the blocks stay eager: their saved activations and the step time are the uncompiled run's
    assert b["loss"]["activations"] == pytest.approx(b["off"]["activations"])
    assert model["memory"]["saved_activations_gib"] == pytest.approx(both["memory"]["saved_activations_gib"])
    assert both["memory"]["saved_activations_gib"] < off["memory"]["saved_activations_gib"]
    step = {k: r["throughput"]["step_time_s"] for k, r in (("off", off), ("both", both), ("loss", loss))}
    assert step["loss"] == pytest.approx(step["off"]) and step["both"] < step["off"]
    assert both["memory"]["peak_gib"] < loss["memory"]["peak_gib"] < off["memory"]["peak_gib"]
    assert loss["config"]["compile_components"] == ["loss"] and "compile_components" not in both["config"]


def test_resolve_orders_and_checks_the_components():
    cfg = TrainConfig(**ROW, compile=True, compile_components=("loss", "model")).resolve(DS16, H96)
    assert cfg.compile_components == ("model", "loss")
    with pytest.raises(MeshplanError, match="compile_components is empty"):
        TrainConfig(**ROW, compile=True, compile_components=()).resolve(DS16, H96)


def test_async_tp_needs_the_model_compiled():
    llama = load_model("llama3-8b")
    kw = dict(gpus=8, tp=8, seq_len=8192, async_tp=True, compile=True)
    TrainConfig(**kw).resolve(llama, load_hardware("h100-sxm"))
    with pytest.raises(MeshplanError, match="async TP is a torch.compile pass: it needs compile on, with model"):
        TrainConfig(**kw, compile_components=("loss",)).resolve(llama, load_hardware("h100-sxm"))


def test_validate_reads_the_column():
    row = {"id": "r", "framework": "torchtitan", "source": "pytorch/torchtitan PR #1610 (2025-08-22)",
           "model": "DeepSeek-V3 16B", "hardware": "h100-96g-500w", "gpus": "8", "dp_shard": "8", "ep": "8",
           "seq_len": "4096", "global_batch_size": "64", "micro_batch_size": "8", "precision": "bf16",
           "compile": "true", "ac": "selective", "measured_tps_per_gpu": "6410", "measured_mem_gib": "78.14",
           "status": "ok"}
    both, loss, spaced = validate_rows([row, {**row, "compile_components": "loss"},
                                        {**row, "compile_components": " model ; loss "}])
    assert loss.predicted_mem_gib > both.predicted_mem_gib
    assert spaced.predicted_mem_gib == pytest.approx(both.predicted_mem_gib)
    (bad,) = validate_rows([{**row, "compile_components": "optimizer"}])
    assert bad.error and "compile_components 'optimizer' is not one of model, loss" in bad.error


def test_plan_file_keeps_it_and_its_fingerprint_ignores_it(tmp_path):
    cfg = TrainConfig(**ROW, compile=True, compile_components=("loss",)).resolve(DS16, H96)
    p = make_plan(DS16, "deepseek-v3-16b", H96, cfg, estimate(DS16, H96, cfg, stack=TT), stack="torchtitan-2025-08")
    text = plan_yaml(p)
    assert "compile_components:\n    - loss\n" in text
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    back = load_plan(path)
    assert back.parallel.compile_components == ("loss",)
    assert back.train_config().compile_components == ("loss",)
    default = make_plan(DS16, "deepseek-v3-16b", H96, TrainConfig(**ROW, compile=True).resolve(DS16, H96), {},
                        stack="torchtitan-2025-08")
    assert "compile_components" not in plan_yaml(default)  # torchtitan's default reads as before the field existed
    assert plan_fingerprint(back) == plan_fingerprint(default)  # the same checkpoints: a run may resume either way


def test_cli_estimate_and_plan_output(tmp_path):
    out = run_cli("estimate", "-m", "deepseek-v3-16b", "--hardware", "h100-96g-500w", "--gpus", "8", "--ep", "8",
                  "--seq-len", "4096", "--global-batch-size", "64", "--micro-batch-size", "8", "--compile",
                  "--compile-components", "loss", "--stack", "torchtitan-2025-08", "-o", str(tmp_path / "p.yaml"))
    assert out.returncode == 0, out.stderr
    assert "compile loss only" in out.stdout
    assert load_plan(tmp_path / "p.yaml").parallel.compile_components == ("loss",)
    bad = run_cli("estimate", "--compile", "--compile-components", "model,optimizer", "-o", str(tmp_path / "b.yaml"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].endswith("unknown component 'optimizer'; use model, loss or model,loss")
    assert not (tmp_path / "b.yaml").exists()


def _loss_only_plan():
    return plan("deepseek-v3-16b", 8, ep=8, seq_len=4096, global_batch_size=64, compile=True,
                compile_components=("loss",))


def test_exports_write_the_components():
    p = _loss_only_plan()
    toml = render(p, "torchtitan-toml", "plan.yaml")
    assert '[compile]\nenable = true' in toml and 'components = ["loss"]' in toml
    assert "--compile.components loss" in " ".join(cli_overrides(p))
    header = " ".join(line.lstrip("# ") for line in render(p, "torchrun", "plan.yaml").splitlines()[:8])
    assert "compile loss only" in header


@pytest.mark.slow
def test_the_releases_read_the_components(tmp_path):
    """torchtitan 0.2.2 parses the TOML and 0.3.0 the Python config module, each with its own ConfigManager: both
    compile the loss alone, as planned (the default plan: model and loss)."""
    loss_only = _loss_only_plan()
    default = plan("deepseek-v3-16b", 8, ep=8, seq_len=4096, global_batch_size=64, compile=True)
    for version, write in (("0.2.2", _toml), ("0.3.0", _python)):
        reqs = {name: write(p, tmp_path / version, name) | {"world_size": 8, "cc": CC[p.hardware.id]}
                for name, p in (("loss", loss_only), ("default", default))}
        out = probe(version, reqs)
        for name, want in (("loss", ["loss"]), ("default", ["model", "loss"])):
            assert "error" not in out[name], (version, out[name].get("error"))
            compile_ = out[name]["config"]["compile"]
            assert compile_["enable"] is True and list(compile_["components"]) == want, (version, compile_)


def _toml(p, folder, name: str) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(render(p, "torchtitan-toml", "plan.yaml"))
    return {"argv": ["--job.config_file", str(path)]}


def _python(p, folder, name: str) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    module = folder / f"meshplan_{name}.py"
    module.write_text(render(p, "torchtitan-py", "plan.yaml"))
    return {"argv": torchtitan_train_argv(p, module)[2:], "path": [folder]}
