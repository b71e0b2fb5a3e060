"""A non-editable `pip install .` ships every package and data file, under the one namespace `meshplan`."""

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"estimator": "meshplan.estimator", "planner": "meshplan.planner", "launcher": "meshplan.launcher",
          "ui": "meshplan.ui", "meshplan": "meshplan"}


def test_every_package_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for top, name in LAYERS.items():
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(".".join((name, *init.parent.relative_to(ROOT / top).parts)))
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert cfg["package-dir"]["meshplan.data"] == "data"


def test_data_files_match_package_data_globs():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p.relative_to(ROOT / "data") for g in cfg["meshplan.data"] for p in (ROOT / "data").glob(g)}
    on_disk = {p.relative_to(ROOT / "data") for p in (ROOT / "data").rglob("*")
               if p.is_file() and p.suffix in (".yaml", ".csv", ".md") and "__pycache__" not in p.parts}
    assert on_disk <= shipped, f"data files the wheel would miss: {sorted(map(str, on_disk - shipped))}"


@pytest.mark.slow
def test_wheel_has_one_top_level_package_and_runs_from_it(tmp_path):
    """Build the wheel, install it into a bare folder and run the estimator from there, away from the checkout."""
    src = tmp_path / "src"  # a copy: pip builds in the source tree (build/, *.egg-info) and the checkout stays clean
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".engines", ".git", "build", "runs", "*.egg-info",
                                                               "__pycache__", "node_modules", ".pytest_cache"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("meshplan-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"meshplan"}, f"the wheel installs other top-level names: {sorted(tops - {'meshplan'})}"
    for must in ("meshplan/estimator/batch.py", "meshplan/data/hardware_profiles/h100-sxm.yaml",
                 "meshplan/ui/streamlit_app.py", "meshplan/ui/tui/app.tcss", "meshplan/launcher/core/train.py"):
        assert must in names, must
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("import meshplan.estimator as e, meshplan.data, sys; "
             "r = e.estimate(e.load_model('llama3-8b'), e.load_hardware('h100-sxm'), e.TrainConfig(gpus=8)); "
             "assert 'estimator' not in sys.modules and 'planner' not in sys.modules; "
             "print(e.__file__, r['memory']['peak_gib'])")
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {probe}"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(site / "meshplan" / "estimator")), out.stdout
