"""benchmarks/profile_step.py, the kernel-time breakdown of a core step for the next GPU lease, kept working on CPU:
its smoke mode profiles the real core (world 1, gloo) on a two-layer model and sums the profiled operators by kind
beside the estimate's breakdown of the same step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from profile_step import KINDS, kind_of  # noqa: E402
from test_measure_gpu import TINY  # noqa: E402

DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import profile_step as p
p.M.MODELS = Path(sys.argv[2])
p.M.GRID = {"tiny-eager": ("tiny-measure", 32, 1, 2, "none", False, "none", "float32")}
sys.exit(p.main(sys.argv[3:]))
"""


def test_kernel_names_fall_in_their_kinds():
    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "gemm"
    assert kind_of("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTT") == "gemm"
    assert kind_of("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>") == \
        "attention"
    assert kind_of("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == \
        "optimizer"
    assert kind_of("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>") \
        == "elementwise"
    assert kind_of("triton_per_fused__to_copy_mul_rsqrt_0") == "elementwise"
    assert kind_of("aten::mm") == "gemm" and kind_of("aten::_fused_adamw_") == "optimizer"
    assert kind_of("Memset (Device)") == "other"


@pytest.mark.slow
def test_cpu_smoke_profiles_a_step_by_kind(tmp_path):
    (tmp_path / "tiny-measure.yaml").write_text(TINY)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT / "benchmarks"), str(tmp_path), "--out", str(out),
                        "--only", "tiny-eager", "--steps", "2", "--device", "cpu"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    entry = json.loads((out / "profile.json").read_text())["tiny-eager"]
    assert entry["device"] == "cpu" and set(entry["ms_by_kind"]) == set(KINDS)
    assert entry["ms_by_kind"]["gemm"] > 0 and entry["ms_by_kind"]["optimizer"] > 0
    assert entry["ms_total"] == pytest.approx(sum(entry["ms_by_kind"].values()), abs=0.05)
    assert entry["phases_s"]["fwd_bwd_s"] > 0 and len(entry["earlier_phases_s"]) == 1
    assert entry["estimate_breakdown_s"]["step_overhead_s"] == pytest.approx(0.002)
    assert entry["top_kernels_ms"] and "===== tiny-eager rc 0 =====" in (out / "logs.txt").read_text()


def test_unknown_names_fail_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_step.py"), "--out", str(tmp_path),
                        "--only", "nope"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "profile_step: unknown grid names ['nope']; see --list"


def test_without_a_gpu_cuda_mode_refuses_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_step.py"), "--out", str(tmp_path / "o")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith("profile_step: no CUDA GPU here")
    assert not (tmp_path / "o").exists()
