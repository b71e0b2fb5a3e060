"""`meshplan web`: the web app (ui/streamlit_app.py) served by Streamlit, headless, on one port."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import typer

from estimator.errors import MeshplanError


def app_path() -> Path:
    """ui/streamlit_app.py of the installed `ui` package, found without running it."""
    spec = importlib.util.find_spec("ui")
    for folder in list(spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "streamlit_app.py"
        if path.is_file():
            return path
    # `ui` can be shadowed by a namespace folder of the same name (e.g. tests/ui on sys.path): ask for the module
    try:
        app = importlib.util.find_spec("ui.streamlit_app")
    except ImportError:
        app = None
    if app is not None and app.origin and Path(app.origin).is_file():
        return Path(app.origin)
    raise MeshplanError("the web app (ui/streamlit_app.py) is not installed with this meshplan")


def streamlit_command(port: int, address: str | None = None) -> list[str]:
    """The command line that serves the app: `python -m streamlit run APP --server.headless true ...`."""
    if not 1 <= port <= 65535:
        raise MeshplanError(f"--port must be in 1..65535, got {port}")
    cmd = [sys.executable, "-m", "streamlit", "run", str(app_path()), "--server.headless", "true",
           "--server.port", str(port), "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    if address:
        cmd += ["--server.address", address]
    return cmd


def web_cmd(
    port: int = typer.Option(8501, "--port", "-p", help="TCP port to serve on"),
    address: str = typer.Option(None, "--address", help="interface to listen on, e.g. 127.0.0.1 [default: all]"),
) -> None:
    """Open meshplan in the browser: ranked plans, memory per GPU and per pipeline stage, the sweep, the
    decision tree, time-to-train and cost across hardware, side-by-side comparison, and downloads of the
    plan, torchtitan config and torchrun / Slurm / mpirun scripts.

    Serves ui/streamlit_app.py with Streamlit (headless); open the URL it prints. Ctrl-C stops it.

    Example: meshplan web --port 8501
    """
    if importlib.util.find_spec("streamlit") is None or importlib.util.find_spec("plotly") is None:
        raise MeshplanError("the web app needs streamlit and plotly: pip install 'meshplan[ui]'")
    cmd = streamlit_command(port, address)
    typer.echo(f"meshplan web: serving on http://{address or 'localhost'}:{port} (Ctrl-C stops)", err=True)
    try:
        rc = subprocess.call(cmd)
    except KeyboardInterrupt:
        rc = 0
    if rc:
        raise typer.Exit(rc)
