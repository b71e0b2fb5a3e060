"""`meshplan export`: torchtitan job configs and launch scripts, golden files, shell safety, environment defaults and
the command (the scripts run against stub launchers: tests/test_export_backends.py; shared helpers:
tests/export_support.py).

Regenerate the golden files with MESHPLAN_UPDATE_GOLDEN=1 after an intended change, and review the diff.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import export_support
import pytest
import yaml
from export_support import (
    CASES,
    CLI,
    GOLDEN,
    HOSTILE,
    PYTHON,
    REFUSED,
    ROOT,
    SCRIPTS,
    UPDATE,
    check_script,
    make,
    plan_path_for,
    recorded,
    run_dir_for,
    run_script,
    script,
    torchrun_parse,
)

from meshplan.estimator.config import TrainConfig
from meshplan.estimator.errors import MeshplanError
from meshplan.estimator.hardware import load_hardware
from meshplan.estimator.model_spec import ModelSpec, load_model
from meshplan.planner.export import (
    FORMATS,
    SUFFIX,
    cli_overrides,
    default_env_path,
    load_env_defaults,
    render,
)
from meshplan.planner.export.torchtitan import layers_per_stage
from meshplan.planner.plan_file import Plan, default_run_dir, make_plan, save_plan

plans, shellcheck = export_support.plans, export_support.shellcheck  # fixtures the tests take by name


# --------------------------------------------------------------------------------------------- golden files
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_golden(plans, case, fmt):
    path = GOLDEN / f"{case}.{fmt}{SUFFIX[fmt]}"
    if (case, fmt) in REFUSED:  # torchtitan 0.3.0 has no tensorwise Float8: no export rather than a wrong one
        with pytest.raises(MeshplanError, match=REFUSED[case, fmt]):
            render(plans[case], fmt, plan_path_for(case), run_dir=run_dir_for(case), python=PYTHON)
        assert not path.exists(), f"{path.name}: a refused export has no golden file"
        return
    text = render(plans[case], fmt, plan_path_for(case), run_dir=run_dir_for(case), python=PYTHON)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with MESHPLAN_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} differs from the golden file (MESHPLAN_UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("case", sorted(CASES) + ["one-node"])
@pytest.mark.parametrize("fmt", SCRIPTS)
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_scripts_pass_bash_n_and_shellcheck(plans, case, fmt, device, tmp_path, shellcheck):
    plan = make("llama3-8b", 8) if case == "one-node" else plans[case]
    text = render(plan, fmt, plan_path_for(case), device=device, run_dir=run_dir_for(case))
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    check_script(text, tmp_path, shellcheck)


CORE_CALL = '-m meshplan.launcher.run_plan --plan "$plan" --run-dir "$run_dir" --device "$device"'


@pytest.mark.parametrize("fmt", ["torchrun", "slurm", "mpirun"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_scripts_always_pass_device_run_dir_and_absolute_python(fmt, nodes, tmp_path, monkeypatch):
    plan = make("llama3-8b", 8 * nodes, global_batch_size=8 * nodes)
    monkeypatch.chdir(tmp_path)
    text = render(plan, fmt, "/p/plan.yaml")  # defaults: cuda, default_run_dir made absolute, sys.executable
    lines = text.splitlines()
    run_dir = tmp_path / default_run_dir(plan)
    assert f"run_dir={shlex.quote(str(run_dir))}" in lines and "device=cuda" in lines
    assert f"python={shlex.quote(sys.executable)}" in lines and 'python="${MESHPLAN_PYTHON:-$python}"' in lines
    assert (CORE_CALL in text) if fmt != "mpirun" else ('--run-dir "$3" --device "$4"' in text)
    code = [line for line in lines if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"(^|exec |srun [^ ]* ?)(python|torchrun) ", line)], code
    cpu = render(plan, fmt, "/p/plan.yaml", device="cpu", run_dir="rel/run")
    assert "device=cpu" in cpu.splitlines() and f"run_dir={tmp_path}/rel/run" in cpu.splitlines()
    if fmt == "slurm":
        assert ("#SBATCH --gpus-per-node=8" in lines) and "--gpus-per-node" not in cpu
    with pytest.raises(MeshplanError, match="--device must be cuda or cpu"):
        render(plan, fmt, "/p/plan.yaml", device="tpu")


def test_scripts_carry_plan_and_estimate(plans):
    text = script(plans["llama3-8b-2x8"], "torchrun", "p.yaml")
    head = text.split("set -euo")[0]
    for needle in ("llama3-8b-16gpu", "llama3-8b", "2 node(s) x 8 h100-sxm", "peak 61.2 GiB/GPU", "7,421 tokens/s/GPU"):
        assert needle in head
    assert "estimate: none stored" in render(plans["llama3-405b-64x8"], "slurm", "p.yaml")


# --------------------------------------------------------------------------------------------- torchtitan
@pytest.mark.parametrize("case", sorted(CASES))
def test_toml_parses_back(plans, case):
    plan = plans[case]
    doc = tomllib.loads(render(plan, "torchtitan-toml", "p.yaml"))
    par, p = doc["parallelism"], plan.parallel
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"], par["tensor_parallel_degree"],
            par["pipeline_parallel_degree"], par["context_parallel_degree"]) == (p.dp_replicate, p.dp_shard, p.tp,
                                                                                p.pp, p.cp)
    assert par["enable_async_tensor_parallel"] is p.async_tp
    assert par["pipeline_parallel_schedule"] == p.pp_schedule
    dp = p.dp_replicate * p.dp_shard
    tr = doc["training"]
    assert tr["global_batch_size"] == plan.training.global_batch_size and tr["seq_len"] == plan.training.seq_len
    assert tr["steps"] == plan.training.steps and tr["max_norm"] == plan.training.grad_clip
    if p.pp > 1:  # all microbatches go through the pipeline: local batch = global / dp
        assert tr["local_batch_size"] == plan.training.global_batch_size // dp
        assert par["pipeline_parallel_microbatch_size"] == p.micro_batch_size
    else:  # local batch = micro-batch; torchtitan accumulates global / (local * dp) steps
        assert tr["local_batch_size"] == p.micro_batch_size
    assert doc["model"]["name"] == "llama3" and doc["model"]["flavor"] in ("8B", "405B")
    assert doc["activation_checkpoint"]["mode"] == p.ac and doc["compile"]["enable"] is p.compile
    assert doc["checkpoint"] == {"enable": True, "folder": "checkpoint", "interval": plan.training.checkpoint_interval}
    assert doc["lr_scheduler"]["decay_type"] == "cosine" and doc["optimizer"]["lr"] == plan.training.optimizer.lr
    if p.float8 == "tensorwise":
        assert doc["model"]["converters"] == ["quantize.linear.float8"]
        assert doc["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"] is True
    else:
        assert "converters" not in doc["model"] and "quantize" not in doc
    assert "<= 0.2.2" in render(plan, "torchtitan-toml", "p.yaml").splitlines()[1]


def test_toml_float8_rowwise_constant_lr_and_custom_model(plans):
    spec = load_model("llama3-8b").model_copy(update={"name": "my-model", "layers": 16})
    cfg = TrainConfig(gpus=8, dp_shard=-1, seq_len=4096, global_batch_size=32, float8="rowwise", micro_batch_size=2)
    plan = make_plan(spec, "my-model.yaml", load_hardware("h100-sxm"), cfg, steps=10)
    plan.training.lr_schedule.decay = "constant"
    doc = tomllib.loads(render(plan, "torchtitan-toml", "p.yaml"))
    assert doc["model"]["flavor"] == "custom"
    assert doc["quantize"]["linear"]["float8"]["recipe_name"] == "rowwise"
    assert doc["lr_scheduler"]["decay_ratio"] == 0.0
    assert doc["training"]["local_batch_size"] == 2  # 32 = 2 per forward x dp 8 x 2 accumulation steps


def test_vpp_maps_to_layers_per_stage():
    plan = make("llama3-405b", 512, tp=8, pp=8, pp_schedule="Interleaved1F1B", vpp=4, global_batch_size=512,
                float8="rowwise")  # llama3_405b() builds rowwise Float8 in, so its command line can run this plan
    lps = layers_per_stage(plan)
    assert -(-(126 + 2) // lps) == 8 * 4
    assert tomllib.loads(render(plan, "torchtitan-toml", "p"))["parallelism"]["pipeline_parallel_layers_per_stage"] == lps
    assert f"--parallelism.pipeline_parallel_layers_per_stage {lps}" in cli_overrides(plan)


def test_cli_0_3_overrides(plans, tmp_path):
    """The 0.3.0 flags (tests/test_torchtitan_real.py parses them with the real 0.3.0, field by field)."""
    tensorwise = plans["llama3-405b-64x8"]
    plan = tensorwise.model_copy(update={"parallel": tensorwise.parallel.model_copy(update={"float8": "rowwise"})})
    text = render(plan, "torchtitan-cli", "p.yaml")
    assert "torchtitan 0.3.0" in text.splitlines()[1]
    assert '-m torchtitan.train --module "$tt_module" --config "$tt_config"' in text
    assert 'tt_config="${TT_CONFIG:-llama3_405b}"' in text and "STOPS" not in text
    args = shlex.split(" ".join(cli_overrides(plan)))
    assert args[args.index("--parallelism.data_parallel_shard_degree") + 1] == "8"
    assert args[args.index("--parallelism.tensor_parallel_degree") + 1] == "8"
    assert "--compile.enable_async_tensor_parallel" in args and "--parallelism.enable_async_tensor_parallel" not in args
    assert args[args.index("--training.local_batch_size") + 1] == "64"  # 512 / dp 8, in 64 pipeline microbatches
    assert "--training.disable_cuda_graphs" in args and args[-1] == "activation-checkpoint:full"
    # tensorwise: 0.3.0 has no such recipe; the script says so and stops unless TT_CONFIG names a config function
    text = render(tensorwise, "torchtitan-cli", "p.yaml")
    assert "# STOPS unless TT_CONFIG is set: torchtitan 0.3.0 has no tensorwise Float8 recipe" in text
    out = run_script(text, tmp_path, {"MESHPLAN_RDZV_HOST": "10.0.0.1"})
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "torchtitan-toml" in out.stderr
    assert not (tmp_path / "torchrun.argv").exists()


def test_cli_custom_model_needs_a_config_function(tmp_path):
    spec = load_model("llama3-8b").model_copy(update={"name": "tiny", "layers": 2})
    plan = make_plan(spec, "tiny.yaml", load_hardware("h100-sxm"), TrainConfig(gpus=8, dp_shard=-1, seq_len=1024))
    out = run_script(render(plan, "torchtitan-cli", "p.yaml"), tmp_path)
    assert out.returncode == 2 and "TT_CONFIG" in out.stderr
    out = run_script(render(plan, "torchtitan-cli", "p.yaml"), tmp_path, {"TT_CONFIG": "my_tiny"})
    assert out.returncode == 0, out.stderr
    argv, _ = recorded(tmp_path, "torchrun")
    assert argv[argv.index("--config") + 1] == "my_tiny" and argv[argv.index("--module") + 1] == "llama3"


# --------------------------------------------------------------------------------------------- shell safety
def hostile_plan(tag: str, nodes: int = 1) -> Plan:
    plan = make("llama3-8b", 8 * nodes, global_batch_size=8 * nodes)
    evil = HOSTILE.format(tag=tag)
    model = plan.model.model_copy(update={"name": "x\n" + evil + "\r\ntouch /tmp/pwned-" + tag})
    # bypass validation on purpose: the renderer must stay safe even for values the schema would reject
    return plan.model_copy(update={"name": evil, "model": model, "model_source": evil})


@pytest.mark.parametrize("fmt", FORMATS)
def test_hostile_names_and_paths_stay_inert(fmt, tmp_path, shellcheck):
    tag = uuid.uuid4().hex
    plan = hostile_plan(tag, nodes=2)
    if fmt == "torchtitan-py":  # builds torchtitan's own llama3 presets only: keep the preset's source
        plan = plan.model_copy(update={"model_source": "llama3-8b"})
    path = "/plans/" + HOSTILE.format(tag=tag) + "/plan.yaml"
    text = render(plan, fmt, path, run_dir=path + ".run", python=path + ".python")
    for line in text.splitlines():  # names only ever appear in comments, or quoted
        if "pwned" in line and not line.lstrip().startswith("#"):
            assert line.startswith(("plan=", "run_dir=", "python=", "rdzv_id=", "description = ", "  echo ")), line
    if fmt == "torchtitan-toml":
        doc = tomllib.loads(text)
        assert "\n" not in doc["job"]["description"]
    elif fmt == "torchtitan-py":  # names only in comments: the module compiles, and nothing it runs names them
        code = compile(text, "export.py", "exec")
        assert not [c for c in code.co_consts if isinstance(c, str) and "pwned" in c]
    else:
        check_script(text, tmp_path, shellcheck)
        assert f"plan={shlex.quote(path)}" in text or fmt == "torchtitan-cli"
        if fmt != "torchtitan-cli":
            assert f"run_dir={shlex.quote(path + '.run')}" in text and f"python={shlex.quote(path + '.python')}" in text
    assert not Path(f"/tmp/pwned-{tag}").exists()


def test_executed_torchrun_script_passes_a_hostile_plan_path_intact(tmp_path):
    """Export through the CLI from a hostile path, run the script with `python` stubbed, inspect the argv."""
    tag = uuid.uuid4().hex
    evil_dir = tmp_path / HOSTILE.format(tag=tag)
    evil_dir.mkdir(parents=True)
    plan_file = evil_dir / "plan.yaml"
    save_plan(make("llama3-8b", 8, name="one-node"), plan_file)
    out_file = tmp_path / "run.sh"
    run_dir = evil_dir / "run"
    out = cli("export", str(plan_file), "-f", "torchrun", "-o", str(out_file), "--max-restarts", "3",
              "--run-dir", str(run_dir), "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert os.stat(out_file).st_mode & 0o777 == 0o755
    res = run_script(out_file.read_text(), tmp_path, {"PYTORCH_ALLOC_CONF": "mine"})
    assert res.returncode == 0, res.stderr
    argv, env = recorded(tmp_path, "python")
    assert argv == ["-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "8",
                    "--max-restarts", "3", "--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
                    "--shutdown-timeout", "240", "-m", "meshplan.launcher.run_plan", "--plan", str(plan_file.resolve()),
                    "--run-dir", str(run_dir.resolve()), "--device", "cpu"]
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and env["PYTORCH_ALLOC_CONF"] == "mine"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["NCCL_DEBUG"] == "WARN"
    assert not Path(f"/tmp/pwned-{tag}").exists()
    args = torchrun_parse(argv[2:])
    assert args.standalone and args.training_script == "meshplan.launcher.run_plan" and args.module
    assert args.shutdown_timeout == 240 and "SIGUSR1" in args.signals_to_handle
    assert args.training_script_args == ["--plan", str(plan_file.resolve()), "--run-dir", str(run_dir.resolve()),
                                         "--device", "cpu"]


def test_cli_defaults_cuda_and_the_plans_own_absolute_run_dir(tmp_path):
    plan_file = tmp_path / "plan.yaml"
    plan = make("llama3-8b", 8, name="one-node")
    save_plan(plan, plan_file)
    out = cli("export", str(plan_file), "-f", "slurm", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert f"run_dir={shlex.quote(str((tmp_path / default_run_dir(plan)).resolve()))}" in lines
    assert "device=cuda" in lines and "#SBATCH --gpus-per-node=8" in lines
    assert f"python={shlex.quote(sys.executable)}" in lines
    out = cli("export", str(plan_file), "-f", "mpirun", "--device", "tpu", cwd=tmp_path)
    assert out.returncode == 2 and "tpu" in out.stderr


# --------------------------------------------------------------------------------------------- env defaults
def test_env_defaults_are_valid_and_documented():
    env = load_env_defaults()
    names = {e.name: e for e in env.for_backend("torchrun")}
    for key in ("OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                "NCCL_DEBUG"):
        assert key in names and len(names[key].why) > 20
    assert names["PYTORCH_CUDA_ALLOC_CONF"].value == names["PYTORCH_ALLOC_CONF"].value == "expandable_segments:True"
    assert default_env_path().name == "env.yaml"
    for fmt in SCRIPTS:
        assert 'export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"' in render(
            make("llama3-8b", 8), fmt, "p.yaml")


@pytest.mark.parametrize(("doc", "needle"), [
    ({"common": [{"name": "X", "value": "$(id)", "why": "w"}]}, "shell-inert"),
    ({"common": [{"name": "X", "value": "a b", "why": "w"}]}, "shell-inert"),
    ({"common": [{"name": "X", "value": True, "why": "w"}]}, "quoted string"),
    ({"common": [{"name": "1X", "value": "1", "why": "w"}]}, "name"),
    ({"common": [{"name": "X", "value": "1", "why": "w"}, {"name": "X", "value": "2", "why": "w"}]}, "duplicate"),
    ({"common": [{"name": "X", "value": "1"}]}, "why"),
    ({"kubernetes": []}, "kubernetes"),
])
def test_env_defaults_reject_bad_files(tmp_path, doc, needle):
    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(MeshplanError, match=needle) as err:
        load_env_defaults(path)
    assert "\n" not in str(err.value)


def test_backend_entries_override_common(tmp_path):
    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump({"common": [{"name": "NCCL_DEBUG", "value": "WARN", "why": "w"}],
                                    "mpirun": [{"name": "NCCL_DEBUG", "value": "INFO", "why": "w"}]}))
    env = load_env_defaults(path)
    assert [e.value for e in env.for_backend("mpirun")] == ["INFO"]
    assert [e.value for e in env.for_backend("slurm")] == ["WARN"]
    assert 'NCCL_DEBUG="${NCCL_DEBUG:-INFO}"' in render(make("llama3-8b", 8), "mpirun", "p", env_file=path)


# --------------------------------------------------------------------------------------------- API errors
def test_render_errors():
    plan = make("llama3-8b", 8)
    with pytest.raises(MeshplanError, match="unknown export format 'kubernetes'"):
        render(plan, "kubernetes")
    bad = plan.model_copy(update={"training": plan.training.model_copy(update={"global_batch_size": 12})})
    with pytest.raises(MeshplanError, match="does not divide"):
        render(bad, "torchtitan-toml")
    assert isinstance(plan.model, ModelSpec)


# --------------------------------------------------------------------------------------------- the command
def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, cwd=cwd or ROOT,
                          env=env, timeout=120)


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory, plans) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    save_plan(plans["llama3-8b-2x8"], path)
    return path


def test_cli_writes_executable_script_and_toml(plan_file, tmp_path):
    out = cli("export", str(plan_file), "-f", "slurm", "-o", str(tmp_path / "out.sh"), "--partition", "gpu",
              "--time", "04:00:00")
    assert out.returncode == 0, out.stderr
    mode = os.stat(tmp_path / "out.sh").st_mode
    assert mode & stat.S_IXUSR and mode & 0o777 == 0o755
    text = (tmp_path / "out.sh").read_text()
    assert "#SBATCH --partition=gpu" in text and f"plan={shlex.quote(str(plan_file.resolve()))}" in text
    out = cli("export", str(plan_file), "--format", "torchtitan-toml", "--output", str(tmp_path / "job.toml"))
    assert out.returncode == 0, out.stderr
    assert os.stat(tmp_path / "job.toml").st_mode & 0o777 == 0o644
    assert tomllib.loads((tmp_path / "job.toml").read_text())["parallelism"]["data_parallel_shard_degree"] == 16
    out = cli("export", str(plan_file), "-f", "mpirun", "--plan-path", "/cluster/plan.yaml")
    assert out.returncode == 0 and "plan=/cluster/plan.yaml" in out.stdout and out.stdout.startswith("#!")


@pytest.mark.parametrize("case", ["bad-format", "missing-plan", "malformed-yaml", "invalid-plan", "bad-partition",
                                  "no-output-dir"])
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(plan_file, tmp_path, case):
    target = tmp_path / "out.sh"
    args = ["export", str(plan_file), "-f", "slurm", "-o", str(target)]
    if case == "bad-format":
        args[3] = "kubernetes"
    elif case == "missing-plan":
        args[1] = str(tmp_path / "nope.yaml")
    elif case == "malformed-yaml":
        bad = tmp_path / "bad.yaml"
        bad.write_text("name: [unclosed\n  - x: {\n")
        args[1] = str(bad)
    elif case == "invalid-plan":
        bad = tmp_path / "bad.yaml"
        doc = yaml.safe_load(plan_file.read_text())
        doc["parallel"]["tp"] = 3
        bad.write_text(yaml.safe_dump(doc))
        args[1] = str(bad)
    elif case == "bad-partition":
        args += ["--partition", "a'b"]
    elif case == "no-output-dir":
        target = tmp_path / "missing" / "out.sh"
        args[5] = str(target)
    out = cli(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshplan: error: "), out.stderr
    assert "Traceback" not in out.stderr
    assert not target.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.sh")] == []


def test_meshplan_export_is_registered(plan_file):
    from meshplan import cli as meshplan_cli

    assert "export" in meshplan_cli.COMMANDS
    out = subprocess.run([sys.executable, "-m", "meshplan", "export", str(plan_file), "-f", "torchrun"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         timeout=120)
    assert out.returncode == 0 and "meshplan.launcher.run_plan" in out.stdout, out.stderr


@pytest.mark.parametrize("kw, needle, needle_022", [
    ({"tp": 8, "dp_shard": 1}, "fp32 compute for TP or PP", "runs it in fp32"),
    ({"dp_replicate": 8, "dp_shard": 1}, "autocast and DDP", "under torch.autocast with DDP"),
    ({"tp": 8, "dp_shard": 1, "dtype": "bfloat16"}, "in bf16 throughout", "in bf16 without FSDP"),
])
def test_an_export_to_the_other_release_of_a_plan_without_fsdp_says_what_it_runs_instead(kw, needle, needle_022,
                                                                                      tmp_path):
    """torchtitan 0.3.0 wraps FSDP2 on every layout (one shard where dp_shard x cp = 1); 0.2.2 only where it shards,
    with autocast or fp32 elsewhere. A plan without FSDP estimated with 0.2.2's rules (stack torchtitan-2026-03) gets a
    note in both 0.3.0 exports' headers and one `note:` line from `meshplan export`; estimated with the current
    stack (0.3.0's rules), the 0.2.2 TOML gets it instead. A plan with FSDP gets none."""
    old = make_plan(load_model("llama3-8b"), "llama3-8b", load_hardware("h100-sxm"),
                    TrainConfig(gpus=8, seq_len=8192, global_batch_size=8, **kw), stack="torchtitan-2026-03")
    current = make("llama3-8b", 8, global_batch_size=8, **kw)
    for fmt in ("torchtitan-cli", "torchtitan-py"):
        text = render(old, fmt, "p.yaml")
        assert "# Note: torchtitan 0.3.0 wraps FSDP2 on every layout" in text and needle in " ".join(
            line.lstrip("# ") for line in text.splitlines()), fmt
        assert "wraps FSDP2" not in render(current, fmt, "p.yaml")
    toml = render(current, "torchtitan-toml", "p.yaml")
    assert "# Note: this plan has no FSDP" in toml and needle_022 in " ".join(
        line.lstrip("# ") for line in toml.splitlines())
    assert "Note:" not in render(old, "torchtitan-toml", "p.yaml")
    fsdp = make("llama3-8b", 8, global_batch_size=8)
    assert "wraps FSDP2" not in render(fsdp, "torchtitan-cli", "p.yaml")
    assert "no FSDP" not in render(fsdp, "torchtitan-toml", "p.yaml")
    for plan, fmt, start in ((old, "torchtitan-py", "note: torchtitan 0.3.0 wraps FSDP2"),
                             (current, "torchtitan-toml", "note: this plan has no FSDP")):
        path = tmp_path / "plan.yaml"
        save_plan(plan, path)
        out = cli("export", str(path), "-f", fmt, "-o", str(tmp_path / "job.out"))
        assert out.returncode == 0 and out.stderr.startswith(start), out.stderr
        assert len([line for line in out.stderr.splitlines() if line.startswith("note:")]) == 1
    out = cli("export", str(path), "-f", "torchtitan-py", "-o", str(tmp_path / "job.py"))
    assert out.returncode == 0 and "note:" not in out.stderr


def test_the_toml_export_refuses_ddp_beside_tp_which_0_2_2_raises_on(tmp_path):
    """torchtitan 0.2.2 applies DDP only where dp_replicate is the whole mesh (parallelize_llama raises 'DDP has not
    supported > 1D parallelism'): a dp_replicate x tp plan without FSDP is refused for its TOML in one line, and the
    0.3.0 exports (FSDP2 with one shard there) take it; DDP alone is exported."""
    both = make("llama3-8b", 16, global_batch_size=16, dp_replicate=2, dp_shard=1, tp=8, dtype="bfloat16")
    with pytest.raises(MeshplanError, match="DDP only where dp_replicate is the whole mesh.*torchtitan-py") as e:
        render(both, "torchtitan-toml", "p.yaml")
    assert "\n" not in str(e.value)
    assert "data_parallel_replicate_degree" in render(both, "torchtitan-py", "p.yaml")
    alone = make("llama3-8b", 8, global_batch_size=8, dp_replicate=8, dp_shard=1)
    assert "data_parallel_replicate_degree = 8" in render(alone, "torchtitan-toml", "p.yaml")
    path = tmp_path / "plan.yaml"
    save_plan(both, path)
    out = cli("export", str(path), "-f", "torchtitan-toml", "-o", str(tmp_path / "job.toml"))
    assert out.returncode != 0 and "1D parallelism" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "job.toml").exists()


def test_a_plan_from_a_config_json_exports_as_the_torchtitan_flavor_of_its_shapes():
    """Planned from Qwen3-30B-A3B's Hugging Face config.json (or Llama 3.1 8B's) rather than the preset's name, the
    model is still torchtitan's 30B-A3B (8B) flavor: the exports said "none has the shapes of config" and wrote a
    'custom' llama3 flavor. Every line below the header is the preset plan's."""
    from torchtitan_support import HF_QWEN3_30B, plan

    from meshplan.planner.export import render
    from meshplan.planner.export._common import preset_of

    kw = dict(global_batch_size=32, seq_len=4096, ep=8, ac="full")
    from_json, from_preset = plan(str(HF_QWEN3_30B), 16, **kw), plan("qwen3-30b-a3b", 16, **kw)
    assert preset_of(from_json) == "qwen3-30b-a3b"
    for fmt in ("torchtitan-toml", "torchtitan-py"):
        a, b = render(from_json, fmt, "plan.yaml"), render(from_preset, fmt, "plan.yaml")
        body = [line for line in a.splitlines() if not line.startswith("#") and "qwen3-30b-a3b" not in line.lower()
                and "config.json" not in line]
        assert body and all(line in b.splitlines() for line in body), fmt
        assert ('flavor = "30B-A3B"' if fmt == "torchtitan-toml" else "model_registry('30B-A3B'") in a, fmt
