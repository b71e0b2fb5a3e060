"""The attention kernel a job calls. torchtitan made FlexAttention every language model's attention on 2026-06-09
(#3571; 0.3.0 refuses "sdpa"), so the current `torchtitan` stack times FlexAttention (at `flex_attention_factor` of
FlashAttention-2) while the releases before it, other frameworks and meshplan's own core (which calls
F.scaled_dot_product_attention) time SDPA's kernel (cuDNN's on Hopper). `validate` reads an `attention_kernel`
column."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from torchtitan_support import engine

from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack
from meshplan.estimator.physics.compute import attention_kernel
from meshplan.estimator.stack import stack_for_run
from meshplan.estimator.validate import row_inputs, validate_rows

H100 = load_hardware("h100-sxm")
TT = load_stack("torchtitan")
LLAMA = load_model("llama3-8b")


def test_torchtitan_030_calls_flex_attention():
    """0.3.0's model registries default to attn_backend "flex" and its attention config refuses "sdpa"."""
    src = ("import inspect, json\n"
           "from torchtitan.models.common.config_utils import get_attention_config\n"
           "out = {}\n"
           "for name in ('llama3', 'qwen3', 'deepseek_v3'):\n"
           "    mod = __import__(f'torchtitan.models.{name}', fromlist=['model_registry'])\n"
           "    out[name] = inspect.signature(mod.model_registry).parameters['attn_backend'].default\n"
           "try:\n"
           "    get_attention_config('sdpa')\n"
           "    out['sdpa'] = 'accepted'\n"
           "except ValueError as e:\n"
           "    out['sdpa'] = str(e)\n"
           "print('KERNELS', json.dumps(out))\n")
    env = {"PYTHONPATH": engine("0.3.0"), "PYTHONNOUSERSITE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.split("KERNELS ", 1)[1])
    assert [got[m] for m in ("llama3", "qwen3", "deepseek_v3")] == ["flex"] * 3
    assert "no longer supported for language models" in got["sdpa"]
    assert TT.attention_kernel == "flex"


def test_each_release_times_the_kernel_it_ran():
    assert stack_for_run("torchtitan", "2026-03") == "torchtitan-2026-03"
    assert stack_for_run("torchtitan", "2026-04") == stack_for_run("torchtitan", "2026-05") == "torchtitan-2026-05"
    assert stack_for_run("torchtitan", "2026-07") == "torchtitan"
    kernels = {s: load_stack(s).attention_kernel for s in ("torchtitan-2024", "torchtitan-2025-09", "torchtitan-2026-03",
                                                           "torchtitan-2026-05", "torchtitan", "generic",
                                                           "llm-foundry", "kempnerforge")}
    assert kernels.pop("torchtitan") == "flex" and set(kernels.values()) == {"sdpa"}, kernels
    # on an H100, FlexAttention at 0.87 of FlashAttention-2; SDPA there runs cuDNN's kernel, faster still
    name, eff = attention_kernel(H100, TT)
    assert name == "FlexAttention" and eff == pytest.approx(H100.efficiency.attention * TT.flex_attention_factor)
    assert attention_kernel(H100, TT, "sdpa") == ("cuDNN's fused attention", H100.efficiency.attention_cudnn)
    assert attention_kernel(H100, load_stack("torchtitan-2024")) == ("FlashAttention-2", H100.efficiency.attention)


@pytest.mark.parametrize("seq_len", [4096, 32768])
def test_flex_costs_attention_time_only(seq_len):
    kw = dict(gpus=8, seq_len=seq_len, global_batch_size=8, ac="full")
    flex = estimate(LLAMA, H100, TrainConfig(**kw), stack=TT)
    sdpa = estimate(LLAMA, H100, TrainConfig(**kw, attention_kernel="sdpa"), stack=TT)
    # the configuration's own choice is exactly the dated SDPA release's estimate
    assert sdpa["throughput"] == estimate(LLAMA, H100, TrainConfig(**kw), stack=load_stack("torchtitan-2026-05"))[
        "throughput"] | {"attention_kernel": "cuDNN's fused attention"}
    f, s = flex["throughput"], sdpa["throughput"]
    assert (f["attention_kernel"], s["attention_kernel"]) == ("FlexAttention", "cuDNN's fused attention")
    assert f["breakdown_s"]["compute"] > s["breakdown_s"]["compute"]
    for part in ("elementwise", "fsdp_exposed", "optimizer_step"):
        assert f["breakdown_s"][part] == pytest.approx(s["breakdown_s"][part]), part
    assert flex["memory"]["peak_gib"] == sdpa["memory"]["peak_gib"]
    assert sdpa["config"]["attention_kernel"] == "sdpa" and "attention_kernel" not in flex["config"]
    slower = 1 - f["tokens_per_sec_per_gpu"] / s["tokens_per_sec_per_gpu"]
    assert (0.02 < slower < 0.08) if seq_len == 4096 else (0.08 < slower < 0.2), slower  # attention's share grows


def test_validate_reads_the_column_and_the_core_runs_sdpa():
    row = dict(id="r", source="test", framework="torchtitan", model="Llama 3 8B", hardware="h100-sxm", gpus="8",
               seq_len="8192", global_batch_size="8", micro_batch_size="1", precision="bf16", ac="selective",
               measured_tps_per_gpu="6000")
    assert row_inputs(row)[3].attention_kernel == "default"
    assert row_inputs({**row, "attention_kernel": "flex_attention"})[3].attention_kernel == "flex"
    assert row_inputs({**row, "framework": "meshplan"})[3].attention_kernel == "sdpa"  # the core's SDPA
    titan, core = validate_rows([row, {**row, "id": "c", "framework": "meshplan"}])
    assert titan.stack == core.stack == "torchtitan" and core.predicted_tps_per_gpu > titan.predicted_tps_per_gpu
    bad = validate_rows([{**row, "attention_kernel": "xformers"}])[0]
    assert bad.error == "row r: attention_kernel 'xformers' is none of sdpa, flex (or empty: the stack's)"


def test_the_022_toml_says_when_its_flavor_calls_another_kernel():
    from torchtitan_support import plan

    from meshplan.planner.export import render

    llama = plan("llama3-8b", 8, seq_len=8192, global_batch_size=8)
    assert llama.stack == "torchtitan"
    def said(p) -> str:  # the TOML's comments as one line
        return " ".join(line.lstrip("# ") for line in render(p, "torchtitan-toml", "plan.yaml").splitlines())

    text = said(llama)
    assert "Note: torchtitan 0.2.2's 8B flavor calls SDPA (cuDNN's or FlashAttention-2's kernel), where the " \
           "estimate timed FlexAttention (stack torchtitan)" in text
    old = llama.model_copy(update={"stack": "torchtitan-2026-03"})
    assert "flavor calls" not in render(old, "torchtitan-toml", "plan.yaml")
    dsv3 = plan("deepseek-v3-16b", 8, ep=8, seq_len=4096, global_batch_size=16).model_copy(
        update={"stack": "torchtitan-2026-03"})
    assert "16B flavor calls FlexAttention, where the estimate timed SDPA" in said(dsv3)


def test_a_030_export_of_an_sdpa_estimate_says_it_runs_flex_attention():
    from torchtitan_support import plan

    from meshplan.planner.export import render

    current = plan("llama3-8b", 8, seq_len=8192, global_batch_size=8)
    old = current.model_copy(update={"stack": "torchtitan-2026-05"})
    for fmt in ("torchtitan-py", "torchtitan-cli"):
        said = " ".join(line.lstrip("# ") for line in render(old, fmt, "plan.yaml").splitlines())
        assert "Note: torchtitan 0.3.0 calls FlexAttention for every language model (attn_backend flex; it refuses " \
               "sdpa), where the estimate timed SDPA (stack torchtitan-2026-05)" in said, fmt
        assert "calls FlexAttention" not in render(current, fmt, "plan.yaml"), fmt
