"""meshplan: plan distributed LLM training before spending a GPU-hour.

One namespace holds every layer: `meshplan.estimator` <- `meshplan.planner` <- `meshplan.launcher`, `meshplan.ui`,
with the command line in `meshplan.cli` / `meshplan.commands` on top (nothing below imports it). In a checkout the
layers are the top-level folders `estimator/`, `planner/`, `launcher/`, `ui/` and `data/`; an installed wheel puts
them under `meshplan/` (pyproject's package-dir), so installing meshplan adds no other top-level package.
"""

from pathlib import Path as _Path

_CHECKOUT = _Path(__file__).resolve().parent.parent
# In a checkout (editable install, or the folder on sys.path) the layers sit beside this package: let
# `meshplan.estimator` resolve to `<checkout>/estimator`, and so on.
if not (_Path(__file__).parent / "estimator").is_dir() and (_CHECKOUT / "estimator" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))  # noqa: F821  (a package's __path__)
