"""Time the web app's rerun after a widget change (the issue's target: well under a second).

    python benchmarks/web_rerun.py [--model llama3-70b] [--nodes 8] [--repeat 5]

Runs ui/streamlit_app.py under Streamlit's AppTest (the script, no browser) and times:
  * a rerun that changes the sweep (the memory margin moves to a value not seen before: one new sweep),
  * a rerun that reuses a cached sweep (the chosen plan changes; the margin goes back to a seen value),
for the first view (ranked table + memory and time charts) and for the sweep scatter view.
Prints the median and the worst of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import logging

    from streamlit.testing.v1 import AppTest

    logging.getLogger("streamlit").setLevel(logging.ERROR)
    at = AppTest.from_file(str(ROOT / "ui" / "streamlit_app.py"), default_timeout=300)
    at.session_state["model"] = args.model
    at.session_state["hardware"] = args.hardware
    at.session_state["nodes"] = args.nodes
    t0 = time.perf_counter()
    at.run()
    first = time.perf_counter() - t0
    if at.exception or at.error:
        sys.exit(f"the app failed: {[e.value for e in (*at.exception, *at.error)]}")
    print(at.title[0].value)
    print(f"first run (imports, sweep, caches cold): {first:.3f} s")

    def timed(change) -> float:
        change()
        t = time.perf_counter()
        at.run()
        dt = time.perf_counter() - t
        if at.exception:
            sys.exit(f"the app failed: {[e.value for e in at.exception]}")
        return dt

    for view in ("Plans & memory", "Sweep"):
        at.session_state["view"] = view
        at.run()  # warm this view's caches for the base inputs
        new_sweep, cached, chosen = [], [], []
        for k in range(args.repeat):
            margin = round(0.85 - 0.01 * k - (0.1 if view == "Sweep" else 0.0), 2)
            new_sweep.append(timed(lambda m=margin: at.slider(key="margin").set_value(m)))
            cached.append(timed(lambda: at.slider(key="margin").set_value(0.9)))
            chosen.append(timed(lambda k=k: at.selectbox(key="chosen").set_value(2 + k % 3)))
        for label, xs in (("margin -> new value (one new sweep)", new_sweep),
                          ("margin -> seen value (cached sweep)", cached),
                          ("chosen plan changed (cached sweep)", chosen)):
            print(f"[{view}] {label}: median {statistics.median(xs):.3f} s, worst {max(xs):.3f} s "
                  f"({len(xs)} reruns)")


if __name__ == "__main__":
    main()
