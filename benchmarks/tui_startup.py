"""Start-up of the terminal UI: time from process start to the first frame, and to the first results.

Each run starts a fresh interpreter that runs the app with Textual's headless driver (the same code
path as in a terminal, without writing to one) and reports, relative to the moment the parent spawned
it: `painted` (the first frame is composed: form, tabs, footer) and `results` (the first sweep is on
screen). It also reports which heavy modules were imported, the import time of `ui.tui.app`, and that of
`meshplan.cli` (what `meshplan tui` pays on top). Prints only; asserts nothing. The target on a 2-core
login node: first frame under 1.5 s, without torch or streamlit.

    python benchmarks/tui_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import sys, time
t0 = float(sys.argv[1])
if sys.argv[2] == "cli":
    import meshplan.cli  # noqa: F401  (what `meshplan tui` loads before the app)
from meshplan.ui.tui.app import MeshplanApp

class Bench(MeshplanApp):
    def on_mount(self):
        super().on_mount()
        self.call_after_refresh(self._painted)

    def _painted(self):
        print(f"painted {time.time() - t0:.4f}", flush=True)
        self.set_interval(0.01, self._check)

    def _check(self):
        main = self.get_screen_main()
        if main is not None and main.result is not None:
            print(f"results {time.time() - t0:.4f}", flush=True)
            heavy = [m for m in ("torch", "streamlit", "plotly", "pandas", "numpy") if m in sys.modules]
            print("modules " + ",".join(heavy), flush=True)
            self.exit()

Bench().run(headless=True, size=(80, 24))
"""


def one_run(via: str = "module") -> dict:
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", CHILD, repr(t0), via], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    values: dict = {"wall": time.time() - t0}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key in ("painted", "results"):
            values[key] = float(value)
        elif key == "modules":
            values["modules"] = value
    if "painted" not in values:
        raise SystemExit(f"the app did not start:\n{out.stderr[-2000:]}")
    return values


def import_time(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return float(out.stdout.strip() or "nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    one_run()  # warm the file cache (bytecode, data files)
    print(f"meshplan TUI start-up, {args.runs} runs each, {sys.executable}")
    for via, label in (("module", "python -m ui.tui"), ("cli", "meshplan tui (meshplan.cli loaded first)")):
        runs = [one_run(via) for _ in range(args.runs)]
        painted = [r["painted"] for r in runs]
        results = [r["results"] for r in runs if "results" in r]
        print(f"  {label}")
        print(f"    first frame   median {statistics.median(painted):.3f} s  (min {min(painted):.3f}, "
              f"max {max(painted):.3f})")
        if results:
            print(f"    first results median {statistics.median(results):.3f} s  (min {min(results):.3f}, "
                  f"max {max(results):.3f})  llama3-70b on 8x8 h100-sxm")
        print(f"    heavy modules loaded: {runs[-1].get('modules') or 'none'} (torch and streamlit must not be)")
    print(f"  import meshplan.ui.tui.app: {import_time('meshplan.ui.tui.app'):.3f} s; import meshplan.cli (meshplan tui adds it): "
          f"{import_time('meshplan.cli'):.3f} s")


if __name__ == "__main__":
    main()
