"""A non-editable `pip install .` must ship every package and data file."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for top in ("estimator", "planner", "launcher", "ui", "meshplan"):
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT).parts))
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert cfg["package-dir"]["meshplan_data"] == "data"


def test_data_files_match_package_data_globs():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p.relative_to(ROOT / "data") for g in cfg["meshplan_data"] for p in (ROOT / "data").glob(g)}
    on_disk = {p.relative_to(ROOT / "data") for p in (ROOT / "data").rglob("*")
               if p.is_file() and p.suffix in (".yaml", ".csv", ".md") and "__pycache__" not in p.parts}
    assert on_disk <= shipped, f"data files the wheel would miss: {sorted(map(str, on_disk - shipped))}"
