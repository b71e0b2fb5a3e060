"""How fast meshplan answers a person: whole-process CLI times, one estimate, and input change -> updated view in
both UIs, against the targets of issue 17 on a 2-core machine.

    python benchmarks/interactive_speed.py [--repeat 5]

Prints one line per figure (median and worst of --repeat runs) and its target; asserts nothing.
  * `meshplan --help` and `meshplan plan --model llama3-70b` (fresh interpreters; target 0.35 s and 0.9 s),
  * one `estimator.estimate()` call (target 1 ms),
  * the web app (Streamlit's AppTest, the script server-side): a rerun after the nodes input changes to a value not
    seen before (one new sweep) and after the chosen plan changes (cached sweep; target 300 ms after the sweep),
  * the terminal UI (Textual's Pilot, headless): nodes changed in the form -> the new ranked table on screen.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def report(name: str, times: list[float], target: float | None, unit: str = "s") -> None:
    scale = 1e3 if unit == "ms" else 1.0
    med, worst = statistics.median(times) * scale, max(times) * scale
    goal = f"  (target {target:g} {unit}: {'met' if med <= target else 'NOT met'})" if target else ""
    print(f"{name:<58} median {med:8.3f} {unit}  worst {worst:8.3f} {unit}{goal}")


def process(args: list[str], repeat: int) -> list[float]:
    exe = Path(sys.executable).with_name("meshplan")
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([str(exe), *args], capture_output=True, check=True, cwd=ROOT)
        out.append(time.perf_counter() - t)
    return out


def one_estimate(repeat: int) -> list[float]:
    from meshplan.estimator import TrainConfig, estimate, load_hardware, load_model, load_stack

    m, hw, st = load_model("llama3-70b"), load_hardware("h100-sxm"), load_stack("torchtitan")
    cfg = TrainConfig(gpus=64, gpus_per_node=8, dp_shard=64, seq_len=8192, global_batch_size=512, ac="full",
                      compile=True)
    estimate(m, hw, cfg, st)
    out = []
    for _ in range(repeat * 20):
        t = time.perf_counter()
        estimate(m, hw, cfg, st)
        out.append(time.perf_counter() - t)
    return out


def web(repeat: int) -> tuple[list[float], list[float]]:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "ui" / "streamlit_app.py"), default_timeout=300)
    at.run()
    new, cached = [], []
    for k in range(repeat):
        at.session_state["nodes"] = 9 + k  # a cluster not seen before: one new sweep
        t = time.perf_counter()
        at.run()
        new.append(time.perf_counter() - t)
        at.session_state["chosen"] = 2 + k % 3  # the sweep is cached: only the view
        t = time.perf_counter()
        at.run()
        cached.append(time.perf_counter() - t)
    return new, cached


def tui(repeat: int) -> list[float]:
    from meshplan.ui.tui.app import MeshplanApp

    out: list[float] = []

    async def run() -> None:
        app = MeshplanApp()
        async with app.run_test(size=(100, 32)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            screen = app.get_screen_main()
            for k in range(repeat):
                field = screen.query_one("#f-nodes")
                field.value = str(9 + k)
                t = time.perf_counter()
                screen.submit(force=True)
                while screen.result is None or screen.result.inputs.nodes != 9 + k:
                    await pilot.pause(0.005)
                out.append(time.perf_counter() - t)

    asyncio.run(run())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    n = ap.parse_args().repeat
    report("meshplan --help (whole process)", process(["--help"], n), 0.35)
    report("meshplan plan --model llama3-70b (whole process)", process(["plan", "--model", "llama3-70b"], n), 0.9)
    report("one estimate() call (llama3-70b, FSDP 64)", one_estimate(n), 1.0, "ms")
    new, cached = web(n)
    report("web: nodes changed -> rerun with a new sweep", new, None)
    report("web: chosen plan changed -> rerun (sweep cached)", cached, 0.3)
    report("TUI: nodes changed -> new ranked table on screen", tui(n), None)


if __name__ == "__main__":
    main()
