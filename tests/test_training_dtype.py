"""Training dtype bfloat16 (torchtitan's training.dtype: parameters, gradients and AdamW state in bf16, no fp32 master
copy) through the chain: plan file, planner, `meshplan plan / estimate --dtype`, labels and the torchtitan exports.
The default (float32) leaves every plan file, fingerprint and export as it was. The training core's bf16 run is in
tests/launcher/test_end_to_end.py, the real releases' reading of the exports in tests/test_torchtitan_real.py and tests/test_torchtitan_030.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from meshplan.estimator import TrainConfig, load_hardware, load_model, load_stack
from meshplan.estimator.model_spec import ModelSpec
from meshplan.planner.export import render
from meshplan.planner.export.torchtitan_03 import job
from meshplan.planner.labels import compact_config, differences, short_config
from meshplan.planner.plan_file import load_plan, make_plan, plan_fingerprint, plan_yaml, save_plan
from meshplan.planner.search import plan_search
from meshplan.planner.space import SearchSpace

H100, TT = load_hardware("h100-sxm"), load_stack("torchtitan")
M8 = load_model("llama3-8b")
SMALL = ModelSpec(name="fp-8l", layers=8, hidden=512, heads=8, kv_heads=4, ffn_hidden=1536, vocab=2048)
FSDP8 = dict(gpus=8, dp_shard=8, seq_len=1024, global_batch_size=16)


def _plan(dtype: str = "float32", model: ModelSpec = SMALL, **kw):
    return make_plan(model, model.name, H100, TrainConfig(**{**FSDP8, **kw}, dtype=dtype), steps=100)


def test_default_plans_keep_their_bytes_and_fingerprints():
    # fingerprints computed with the plan code before the field existed: their run directories still resume. The
    # files' bytes also carry the hardware profile as it is (h100-sxm.yaml); their hashes were recomputed when it
    # gained efficiency.attention_cudnn (2026-11-27), the dtype field still absent from them
    for kw, fingerprint, yaml_sha in (({}, "7d176933fd64bcba", "4a92c0ae61491df0"),
                                      ({"finetune": "lora"}, "c873d0998c25f2a4", "d14903e22debb3d9")):
        plan = _plan(**kw)
        assert plan_fingerprint(plan) == fingerprint
        assert hashlib.sha256(plan_yaml(plan).encode()).hexdigest()[:16] == yaml_sha
        assert "dtype" not in plan_yaml(plan)


def test_plan_file_round_trips_bf16_and_gets_its_own_fingerprint(tmp_path):
    plan = _plan("bfloat16")
    text = plan_yaml(plan)
    training = text[text.index("\ntraining:\n"):text.index("\n  grad_clip:")]
    assert "\n  dtype: bfloat16" in training
    back = load_plan(save_plan(plan, tmp_path / "plan.yaml"))
    assert back.training.dtype == "bfloat16" and back.train_config().dtype == "bfloat16"
    assert plan_fingerprint(back) == plan_fingerprint(plan)
    # bf16 state must not resume an fp32 run's checkpoints (nor the other way round): another fingerprint
    assert plan_fingerprint(plan) != plan_fingerprint(_plan())


def test_plan_file_refuses_an_unknown_dtype_in_one_line(tmp_path):
    text = plan_yaml(_plan("bfloat16")).replace("dtype: bfloat16", "dtype: float16", 1)
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(Exception, match="training.dtype") as err:
        load_plan(tmp_path / "bad.yaml")
    assert "\n" not in str(err.value)


def test_planner_plans_the_dtype_asked_for():
    """No dtype dimension: every configuration gets the user's. Under torchtitan 0.2.2's rules bf16 state lifts rule
    29 (TP without FSDP trains in fp32), so tp 8 on one node is ranked; the current release (FSDP2 on every layout)
    ranks it either way; the search result hands the dtype on to the plan."""
    space = dict(tp=[8], cp=[1], pp=[1], ac=["full"], float8=["none"], compile=[False])
    old = load_stack("torchtitan-2026-03")
    assert len(plan_search(M8, H100, old, 8, 8, 4096, 64, space=SearchSpace(**space)).ranked) == 0
    assert len(plan_search(M8, H100, old, 8, 8, 4096, 64, space=SearchSpace(**space, dtype="bfloat16")).ranked) > 0
    fp32 = plan_search(M8, H100, TT, 8, 8, 4096, 64, space=SearchSpace(**space))
    bf16 = plan_search(M8, H100, TT, 8, 8, 4096, 64, space=SearchSpace(**space, dtype="bfloat16"))
    assert len(fp32.ranked) > 0 and len(bf16.ranked) > 0
    assert (bf16.configs.bf16_state == 1).all() and (fp32.configs.bf16_state == 0).all()
    best = bf16.train_config(int(bf16.ranked[0]))
    assert best.dtype == "bfloat16" and "dtype" not in fp32.config(0)
    assert make_plan(M8, "llama3-8b", H100, best).training.dtype == "bfloat16"


def test_plan_cli_writes_the_dtype(cli, tmp_path):
    args = ("plan", "--model", "llama3-8b", "--nodes", "1", "--seq-len", "4096", "--global-batch-size", "16",
            "--tp", "1", "--pp", "1", "--cp", "1", "--ac", "full", "--float8", "none", "--top", "2")
    out = cli(*args, "--dtype", "bfloat16", "--json", "-o", str(tmp_path / "bf16.yaml"))
    assert out.returncode == 0, out.stderr
    assert all(p["config"]["dtype"] == "bfloat16" for p in json.loads(out.stdout)["plans"])
    assert load_plan(tmp_path / "bf16.yaml").training.dtype == "bfloat16"
    text = cli(*args, "--dtype", "bfloat16")
    assert text.returncode == 0 and "training dtype bfloat16" in text.stdout and "dtype bf16" in text.stdout
    bad = cli(*args, "--dtype", "fp16")
    assert bad.returncode != 0 and "--dtype" in bad.stderr and "Traceback" not in bad.stderr


def test_estimate_cli_writes_the_dtype_and_reads_it_back(cli, tmp_path):
    path = tmp_path / "plan.yaml"
    out = cli("estimate", "--gpus", "8", "--seq-len", "4096", "--dtype", "bfloat16", "-o", str(path))
    assert out.returncode == 0, out.stderr
    assert "training dtype bfloat16" in out.stdout
    assert load_plan(path).training.dtype == "bfloat16"
    again = cli("estimate", "--plan", str(path), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["config"]["dtype"] == "bfloat16"


def test_labels_name_the_training_dtype_apart_from_float8():
    cfg = {"dp_replicate": 1, "dp_shard": 8, "tp": 1, "pp": 1, "cp": 1, "micro_batch_size": 1, "ac": "full",
           "float8": "none", "compile": False, "async_tp": False}
    assert "dtype" not in short_config(cfg) and "dt:" not in compact_config(cfg)
    bf16 = {**cfg, "dtype": "bfloat16"}
    assert short_config(bf16) == "dp 1x8, mbs 1, AC full, dtype bf16"
    assert compact_config(bf16) == "fsdp8 mb1 AC:full dt:b16"
    # a column of mostly bf16-state plans: the word goes to the header, an fp32 one says so
    labels = [compact_config(bf16)] * 3 + [compact_config({**cfg, "float8": "rowwise"})]
    header, cells = differences(labels)
    assert header == ["mb1", "AC:full", "dt:b16"] and cells[-1] == "fsdp8 fp8:row dt:f32"


def test_torchtitan_exports_write_the_dtype_only_for_bf16():
    fp32, bf16 = _plan(model=M8), _plan("bfloat16", model=M8)
    toml = render(bf16, "torchtitan-toml", "plan.yaml")
    training = toml[toml.index("[training]"):toml.index("[parallelism]")]
    assert '\ndtype = "bfloat16"' in training
    assert "dtype" not in render(fp32, "torchtitan-toml", "plan.yaml").replace("# ", "")
    assert job(bf16).training["dtype"] == "bfloat16" and "dtype" not in job(fp32).training
    assert "--training.dtype bfloat16" in render(bf16, "torchtitan-cli", "plan.yaml")
    assert "dtype='bfloat16'" in render(bf16, "torchtitan-py", "plan.yaml")
    for fmt in ("torchtitan-cli", "torchtitan-py"):
        assert "dtype" not in render(fp32, fmt, "plan.yaml")


def test_the_core_wraps_fsdp2_where_the_plans_stack_does():
    """A plan without FSDP (one GPU here) runs on the core as its stack says torchtitan runs it: FSDP2 with one shard
    (the current release, stack torchtitan), or 0.2.2's autocast (stack torchtitan-2026-03)."""
    from meshplan.launcher.core.config import RunConfig
    from meshplan.launcher.plan_run import run_config_fields

    one = dict(gpus=1, dp_shard=1, global_batch_size=2)
    assert RunConfig.from_dict(run_config_fields(_plan(**one))).fsdp_one_rank is True
    old = _plan(**one).model_copy(update={"stack": "torchtitan-2026-03"})
    assert RunConfig.from_dict(run_config_fields(old)).fsdp_one_rank is False


def test_plan_maps_the_dtype_onto_the_core():
    from meshplan.launcher.core.config import RunConfig
    from meshplan.launcher.plan_run import run_config_fields

    assert RunConfig.from_dict(run_config_fields(_plan("bfloat16"))).dtype == "bfloat16"
    assert RunConfig.from_dict(run_config_fields(_plan())).dtype == "float32"
    with pytest.raises(ValueError, match="invalid run config: dtype") as err:
        RunConfig.from_dict({**run_config_fields(_plan()), "dtype": "float16"})
    assert "\n" not in str(err.value)


def test_core_builds_bf16_parameters_with_fp32_rope_and_routing_buffers():
    """torchtitan keeps RoPE and the loss in fp32 under bf16 training: the core builds every parameter in bf16 but
    its RoPE tables and MoE routing buffers in fp32, rotates q / k in fp32 and restores torch's default dtype."""
    from needs import require_module

    torch = require_module("torch")
    from meshplan.launcher.core.model import apply_rope, build_meta_model, cross_entropy, rope_tables

    moe = ModelSpec.model_validate({**SMALL.model_dump(), "name": "moe-8l", "moe": {
        "experts": 8, "top_k": 2, "expert_ffn_hidden": 256, "shared_ffn_hidden": 256}})
    model = build_meta_model(moe, 64, torch.bfloat16)
    assert torch.get_default_dtype() == torch.float32
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in model.buffers()} == {torch.float32}  # rope_cos / rope_sin, expert_bias, counts
    x = torch.randn(1, 8, 2, 16).to(torch.bfloat16)
    cos, sin = rope_tables(torch.arange(8), 16)
    got = apply_rope(x, cos, sin)
    assert got.dtype == torch.bfloat16 and torch.equal(got, apply_rope(x.float(), cos, sin).to(torch.bfloat16))
    logits = torch.randn(1, 8, 32).to(torch.bfloat16)
    assert cross_entropy(logits, torch.zeros(1, 8, dtype=torch.long)).dtype == torch.float32


def test_a_bf16_plan_does_not_resume_an_fp32_run_dir(cli, tmp_path):
    """The run directory of the fp32 plan is refused to the same plan in bf16 (in one line), as to any other plan."""
    fp32, bf16 = save_plan(_plan(), tmp_path / "fp32.yaml"), save_plan(_plan("bfloat16"), tmp_path / "bf16.yaml")
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.yaml").write_text(fp32.read_text())
    out = cli("launch", str(bf16), "--dry-run", "--device", "cpu", "--run-dir", str(run))
    assert out.returncode == 2 and "holds a run of another plan" in out.stderr and out.stderr.count("\n") == 1
    assert cli("launch", str(fp32), "--dry-run", "--device", "cpu", "--run-dir", str(run)).returncode == 0
