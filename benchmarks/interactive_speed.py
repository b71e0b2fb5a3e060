"""How fast meshplan answers a person: whole-process CLI times, one estimate, and input change -> updated view in
both UIs, against the targets of issue 17 on a 2-core machine.

    python benchmarks/interactive_speed.py [--repeat 5]

Prints one line per figure (median and worst of --repeat runs) and its target; asserts nothing. A fixed
plain-Python loop is timed before and after: this machine's speed swings by up to 1.6-1.8x minute to minute, so
figures of different runs compare by it.
  * `meshplan --help` and `meshplan plan --model llama3-70b` (fresh interpreters with the compiled modules Python
    keeps after a first run; target 0.35 s and 0.9 s), and the plan again compiling every module each time
    (PYTHONDONTWRITEBYTECODE=1, as this sandbox sets it: about 0.15 s more),
  * one `estimator.estimate()` call (target 1 ms),
  * the web app (Streamlit's AppTest, the script server-side): a rerun after the nodes input changes to a value not
    seen before (one new sweep) and after the chosen plan changes (cached sweep; target 300 ms after the sweep; the
    whole script, as AppTest runs it: the served page reruns only the chosen plan's fragment),
  * the terminal UI (Textual's Pilot, headless): nodes changed in the form -> the new ranked table on screen, and
    the cursor moved to another plan -> its detail on screen,
  * the web app in headless Chromium (`--chromium`; Debian's /usr/bin/chromium with Playwright): a fresh `meshplan
    web` -> the page's first charts (cold start), another chosen plan -> its metrics on the page (target 300 ms)
    and its two charts drawn, and every URL the page fetched that is not the local server (it should fetch none:
    the app works offline).
    `--shots DIR` saves light and dark screenshots of the plans and the decision tree.
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


def process(args: list[str], repeat: int, bytecode: bool = True) -> list[float]:
    """Whole-process wall times of `meshplan ARGS`. `bytecode`: as on a user's machine, Python keeps the compiled
    modules (__pycache__) from the first run, which is not timed; False: PYTHONDONTWRITEBYTECODE=1, as some
    sandboxes set it, so every run compiles meshplan's modules again."""
    import os

    exe = Path(sys.executable).with_name("meshplan")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    subprocess.run([str(exe), *args], capture_output=True, check=True, cwd=ROOT, env=env)  # warm-up, not timed
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([str(exe), *args], capture_output=True, check=True, cwd=ROOT, env=env)
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


def reference(repeat: int) -> list[float]:
    """A fixed piece of plain Python (no meshplan): how fast this machine runs right now. Its speed swings by up to
    1.6-1.8x minute to minute, so figures of runs taken at different times compare by this line."""
    out = []
    for _ in range(repeat * 4):
        t = time.perf_counter()
        total = 0.0
        for i in range(20_000):
            total += (i % 7) * 0.5 if i & 1 else float(i) / 3.0
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


def tui(repeat: int) -> tuple[list[float], list[float]]:
    """(nodes changed in the form -> the new ranked table, the cursor moved to another plan -> its detail), in one
    headless app (Textual's Pilot)."""
    from meshplan.ui.tui.app import MeshplanApp

    sweeps: list[float] = []
    moves: list[float] = []

    async def run() -> None:
        app = MeshplanApp()
        async with app.run_test(size=(100, 32)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            screen = app.get_screen_main()
            for k in range(repeat):
                screen.query_one("#f-nodes").value = str(9 + k)
                t = time.perf_counter()
                screen.submit(force=True)
                while screen.result is None or screen.result.inputs.nodes != 9 + k:
                    await pilot.pause(0.005)
                sweeps.append(time.perf_counter() - t)
            screen.query_one("#table").focus()
            for k in range(repeat * 4):  # the sweep is done: the view alone
                before = screen.selected()
                t = time.perf_counter()
                await pilot.press("down" if k % 8 < 4 else "up")
                while screen.selected() == before:
                    await pilot.pause(0.001)
                moves.append(time.perf_counter() - t)

    asyncio.run(run())
    return sweeps, moves


SWITCH_JS = """(k) => new Promise(resolve => {
    const metric = () => document.querySelectorAll('[data-testid=stMetricValue]')[1];
    const before = metric().innerText;
    const plots = () => Array.from(document.querySelectorAll('.js-plotly-plot'));
    const drawn = () => plots().length >= 2 && plots()[0].textContent.includes(`#${k + 1} peak`)
        && plots()[1].textContent.includes(`#${k + 1}`);  // the memory bars and the step time of plan #k+1
    const t0 = performance.now();
    let metricMs = null;
    const check = () => {
        if (metricMs === null && metric() && metric().innerText !== before) metricMs = performance.now() - t0;
        if (metricMs !== null && drawn()) resolve([metricMs, performance.now() - t0]);
        else requestAnimationFrame(check);
    };
    document.querySelectorAll('[role=option]')[k].click();
    requestAnimationFrame(check);
})"""


def chromium(repeat: int, shots: Path | None) -> tuple[list[float], list[float], list[float], list[str]]:
    """(cold start: a fresh server -> first charts, chosen plan changed -> new metrics, -> its charts redrawn, URLs
    not from the server)."""
    import os
    import signal
    import socket
    import tempfile
    import urllib.request

    from playwright.sync_api import sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    exe = Path(sys.executable).with_name("meshplan")
    log = tempfile.TemporaryFile()
    server = subprocess.Popen([str(exe), "web", "--port", str(port)], cwd=ROOT, stdout=log, stderr=log,
                              start_new_session=True)
    cold, switch, charts, outside = [], [], [], []
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                time.sleep(0.2)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                         args=["--headless=new", "--no-sandbox", "--disable-gpu"])
            for k in range(max(1, repeat // 2)):
                page = browser.new_page(viewport={"width": 1440, "height": 950})
                page.set_default_timeout(120_000)
                page.on("request", lambda r: outside.append(r.url) if not r.url.startswith((url, "data:", "blob:"))
                        else None)
                t = time.perf_counter()
                page.goto(url + ("" if k == 0 else f"/?nodes={8 + k}"))  # k > 0: a sweep this server has not run
                page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 2")
                cold.append(time.perf_counter() - t)
                page.close()
            page = browser.new_page(viewport={"width": 1440, "height": 950})
            page.set_default_timeout(120_000)
            page.goto(url)
            page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 2")
            main = page.get_by_test_id("stMain")
            for k in range(repeat):
                main.get_by_test_id("stSelectbox").first.click()
                page.get_by_role("option").nth(2 + k % 5).wait_for()
                # timed inside the page: the option's click -> the tokens/s metric showing the new plan's value, and
                # -> both charts drawn for it (Playwright's own click waits for actionability, and expect() polls
                # at 100-1000 ms)
                metric_ms, charts_ms = page.evaluate(SWITCH_JS, 2 + k % 5)
                switch.append(metric_ms / 1e3)
                charts.append(charts_ms / 1e3)
            if shots is not None:
                shots.mkdir(parents=True, exist_ok=True)
                for scheme in ("light", "dark"):
                    p = browser.new_page(viewport={"width": 1440, "height": 1700}, color_scheme=scheme)  # tall: the charts too
                    p.set_default_timeout(120_000)
                    p.goto(url)
                    p.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 2")
                    p.screenshot(path=str(shots / f"web-plans-{scheme}.png"))
                    p.get_by_role("tab", name="Decision tree").click()
                    p.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 1")
                    time.sleep(1.5)
                    p.screenshot(path=str(shots / f"web-tree-{scheme}.png"), full_page=True)
                    p.close()
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    return cold, switch, charts, outside


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chromium", action="store_true", help="also time the web app in headless Chromium")
    ap.add_argument("--shots", type=Path, default=None, help="with --chromium: save screenshots here")
    args = ap.parse_args()
    n = args.repeat
    report("machine reference: a fixed plain-Python loop (before)", reference(n), None, "ms")
    report("meshplan --help (whole process)", process(["--help"], n), 0.35)
    report("meshplan plan --model llama3-70b (whole process)", process(["plan", "--model", "llama3-70b"], n), 0.9)
    report("  the same, compiling every module (no __pycache__)",
           process(["plan", "--model", "llama3-70b"], n, bytecode=False), None)
    report("one estimate() call (llama3-70b, FSDP 64)", one_estimate(n), 1.0, "ms")
    new, cached = web(n)
    report("web: nodes changed -> rerun with a new sweep", new, None)
    report("web: chosen plan changed -> rerun (sweep cached)", cached, 0.3)
    sweeps, moves = tui(n)
    report("TUI: nodes changed -> new ranked table on screen", sweeps, None)
    report("TUI: cursor to another plan -> its detail on screen", moves, 0.3)
    report("machine reference: a fixed plain-Python loop (after)", reference(n), None, "ms")
    if args.chromium:
        cold, switch, charts, outside = chromium(n, args.shots)
        report("web in Chromium: fresh server -> first charts (cold)", cold[:1], None)
        if len(cold) > 1:
            report("web in Chromium: new page, new cluster -> charts", cold[1:], None)
        report("web in Chromium: chosen plan changed -> new metrics", switch, 0.3)
        report("web in Chromium: chosen plan changed -> its charts drawn", charts, None)
        print(f"{'web in Chromium: URLs fetched from outside the server':<58} {len(outside)}"
              + ("  (works offline)" if not outside else ""))
        for u in sorted(set(outside)):
            print(f"    {u}")


if __name__ == "__main__":
    main()
