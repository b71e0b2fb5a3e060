#!/usr/bin/env bash
# The two real torchtitan releases tests/test_torchtitan_real.py parses meshplan's exports with, each in its own
# folder (never mixed, never in the venv): .engines/torchtitan-0.2.2 and .engines/torchtitan-0.3.0, plus the
# one compiled dependency both import, triton, in .engines/triton (a registry wheel; no torch involved).
# Idempotent: a folder whose stamp matches its package list is kept (seconds); anything else is reinstalled.
#
#   .ci/install-torchtitan.sh [PYTHON]     PYTHON: the venv interpreter [.venv/bin/python]
#
# Everything is installed with --no-deps from an explicit, pinned list, so pip can never pull another torch:
# torchtitan's declared dependencies are either already in the venv (torch 2.13.0 CPU, torchao, numpy,
# pyarrow, pandas, huggingface_hub, ...) or listed below (found by importing each release's config path).
# Why triton: 0.3.0's --module llama3 config registry imports the model code, whose MoE token dispatcher
# imports triton kernels at module level (0.2.2's package __init__ does the same through its Float8 converter).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
ROOT=.engines
[ -x "$PY" ] || { echo "install-torchtitan: no python at $PY (run make test once, or pass the venv python)" >&2; exit 1; }

COMMON=(tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.0 typing-extensions==4.16.0
        torchdata==0.11.0 datasets==4.7.0 multiprocess==0.70.19 dill==0.4.1 xxhash==4.1.0 httpx==0.28.1
        tensorboard==2.21.0 absl-py==2.5.1)
TRITON=(triton==3.9.0)
# 0.2.2's MXFP8 converter imports torchao's MXLinearConfig, which the venv's torchao 0.18 no longer has: this
# release gets the torchao that still does (0.16.0, pure Python here; its C kernels are not needed to parse).
TT_022=(torchtitan==0.2.2 torchao==0.16.0 "${COMMON[@]}")
TT_030=(torchtitan==0.3.0 spmd_types==0.2.3 torch_checkpointing==0.1.1 "${COMMON[@]}")

# install DIR PKG...: into DIR (via DIR.tmp, renamed when complete), unless DIR's stamp lists exactly PKG...
install() {
    local dir=$ROOT/$1; shift
    local want="$*"
    if [ -f "$dir/.meshplan-stamp" ] && [ "$(cat "$dir/.meshplan-stamp")" = "$want" ]; then
        echo "install-torchtitan: $dir up to date"
        return
    fi
    echo "install-torchtitan: installing $want into $dir"
    rm -rf "$dir.tmp"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-compile --target "$dir.tmp" "$@" 2>&1 |
        grep -v "^WARNING: Location '" >&2 || true
    # pip's exit status is lost in the pipe: check what it left instead
    for pkg in "$@"; do
        local name=${pkg%%==*}
        name=${name//-/_}
        compgen -G "$dir.tmp/${name}-*.dist-info" >/dev/null ||
            { echo "install-torchtitan: ERROR: $pkg did not install into $dir.tmp" >&2; exit 1; }
    done
    if compgen -G "$dir.tmp/torch-*.dist-info" >/dev/null; then
        echo "install-torchtitan: ERROR: a torch build landed in $dir.tmp; refusing" >&2; exit 1
    fi
    echo "$want" >"$dir.tmp/.meshplan-stamp"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
}

mkdir -p "$ROOT"
install triton "${TRITON[@]}"
install torchtitan-0.2.2 "${TT_022[@]}"
install torchtitan-0.3.0 "${TT_030[@]}"

# Prove each release imports its config path on this torch, in its own folder only.
for v in 0.2.2 0.3.0; do
    log=$(mktemp)
    PYTHONPATH="$ROOT/torchtitan-$v:$ROOT/triton" PYTHONWARNINGS=ignore "$PY" - "$v" 2>"$log" <<'EOF' ||
import importlib.metadata as md, sys, warnings
warnings.simplefilter("ignore")
import torch
import torchtitan.train  # noqa: F401  (the entry point torchrun -m torchtitan.train runs)
from torchtitan.config import ConfigManager  # noqa: F401
got = md.version("torchtitan")
assert got == sys.argv[1], f"expected torchtitan {sys.argv[1]}, imported {got} from {torchtitan.train.__file__}"
print(f"install-torchtitan: torchtitan {got} imports (torch {torch.__version__})")
EOF
        { cat "$log" >&2; rm -f "$log"; echo "install-torchtitan: ERROR: torchtitan $v does not import" >&2; exit 1; }
    rm -f "$log"
done
