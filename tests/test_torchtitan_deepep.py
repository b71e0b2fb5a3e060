"""DeepEP plans read by the real torchtitan releases (tests/torchtitan_support.py runs them): each release takes
the plan's dispatcher into its own DeepEP code, which then asks for the deep_ep package this CPU machine lacks
(a GPU cluster installs it); the same plan with the standard all-to-all builds. A key a release ignored, or did not
know, would fail differently (tests/test_torchtitan_real.py: an unknown TOML key is an error)."""

from __future__ import annotations

import pytest
from torchtitan_support import CC, engine, plan, probe

from meshplan.planner.export import render, torchtitan_train_argv

pytestmark = pytest.mark.slow
NEEDS_DEEP_EP = "ImportError: DeepEP is required for this module"  # 0.2.2
NEEDS_DEEP_EP_V2 = "ImportError: DeepEP v2 (>= 2.0.0, ElasticBuffer) is required for this module"  # 0.3.0
NEEDS_HYBRID_EP = "ImportError: HybridEP requires deep_ep library"  # 0.3.0, DeepEP's hybrid-ep branch
# 0.3.0's distributed/deepep/hybridep.py (the only module that imports it) needs a torch nightly's CustomClassBase:
# under torch 2.13.0 its import stops first, under the nightly 0.3.0 asks for the missing deep_ep does
HYBRID_EP_MODULE = "ImportError: cannot import name 'CustomClassBase' from 'torch._library.opaque_object'"


def _cases():
    kw = dict(global_batch_size=32, seq_len=4096, ac="full")
    return {backend: plan("deepseek-v3-16b", 16, ep=8, expert_parallel_comm_backend=backend, **kw)
            for backend in ("standard", "deepep", "hybridep")}


def _answers(version: str, tmp_path, request_of) -> dict:
    """The release's answer for the standard and the deepep plan, each written and asked for by `request_of(plan,
    folder, backend)`."""
    engine(version)
    reqs = {backend: request_of(p, tmp_path, backend) | {"world_size": 16, "cc": CC[p.hardware.id]}
            for backend, p in _cases().items() if version == "0.3.0" or backend != "hybridep"}
    out = probe(version, reqs)
    assert "error" not in out["standard"], out["standard"].get("error")
    assert out["standard"]["dims"]["ep"] == 8
    return out


def _toml(p, folder, backend: str) -> dict:
    path = folder / f"{backend}.toml"
    path.write_text(render(p, "torchtitan-toml", "plan.yaml"))
    return {"argv": ["--job.config_file", str(path)]}


def _python(p, folder, backend: str) -> dict:
    module = folder / f"meshplan_{backend}.py"
    module.write_text(render(p, "torchtitan-py", "plan.yaml"))
    return {"argv": torchtitan_train_argv(p, module)[2:], "path": [folder]}


def test_0_2_2_takes_a_deepep_toml_into_its_deepep_code(tmp_path):
    out = _answers("0.2.2", tmp_path, _toml)
    assert out["deepep"].get("error", "").startswith(NEEDS_DEEP_EP), out["deepep"]


def test_0_3_0_takes_a_deepep_python_config_into_its_deepep_code(tmp_path):
    out = _answers("0.3.0", tmp_path, _python)
    assert out["deepep"].get("error", "").startswith(NEEDS_DEEP_EP_V2), out["deepep"]
    # HybridEP (0.3.0 only: the TOML export for 0.2.2 refuses it, tests/test_hybridep.py): its own code's ask
    assert out["hybridep"].get("error", "").startswith((NEEDS_HYBRID_EP, HYBRID_EP_MODULE)), out["hybridep"]
