"""`meshplan web`: the web app (ui/streamlit_app.py) served by Streamlit, headless, on one port."""

from __future__ import annotations

import errno
import importlib.util
import os
import socket
import sys
from pathlib import Path

import typer

from meshplan.estimator.errors import MeshplanError


def app_path() -> Path:
    """ui/streamlit_app.py of this meshplan (the module `meshplan.ui.streamlit_app`), found without running it."""
    try:
        app = importlib.util.find_spec("meshplan.ui.streamlit_app")
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


def check_port_free(port: int, address: str | None = None) -> None:
    """Raise MeshplanError (one line) unless Streamlit could listen on `address`:`port` now.

    Binds and closes a probe socket on each address Streamlit would use (every interface when `address`
    is None), with SO_REUSEADDR as Streamlit's server sets it, so a port in TIME_WAIT counts as free."""
    try:
        infos = socket.getaddrinfo(address or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise MeshplanError(f"--address {address!r} is not an address this host can listen on: {exc}") from None
    where = f"{address}:{port}" if address else f"port {port}"
    for family, kind, proto, _, sockaddr in infos:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:  # e.g. no IPv6 on this host: Streamlit skips it too
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise MeshplanError(f"{where} is in use; stop what serves it or pass --port N") from None
                if exc.errno == errno.EADDRNOTAVAIL and family == socket.AF_INET6 and not address:
                    continue
                raise MeshplanError(f"cannot listen on {where}: {exc.strerror or exc}") from None


def web_cmd(
    port: int = typer.Option(8501, "--port", "-p", help="TCP port to serve on"),
    address: str = typer.Option(
        "127.0.0.1", "--address",
        help="interface to listen on: this machine only by default (reach a login node with ssh -L 8501:localhost:8501); "
             "0.0.0.0 serves every interface"),
    stack: str = typer.Option("torchtitan", "--stack", help="framework behaviour profile every estimate uses: a "
                              "built-in id (torchtitan, torchtitan-2026-03, llm-foundry, generic, ...) or a stack YAML "
                              "(the one `meshplan calibrate` writes); the downloaded plans keep it"),
) -> None:
    """Open meshplan in the browser: ranked plans, memory per GPU and per pipeline stage, the sweep, the
    decision tree, time-to-train and cost across hardware, side-by-side comparison, and downloads of the
    plan, torchtitan config and torchrun / Slurm / mpirun scripts.

    Serves ui/streamlit_app.py with Streamlit (headless); open the URL it prints. Ctrl-C stops it.

    Example: meshplan web --port 8501

    Your own calibrated profile: meshplan web --stack ./mycluster.yaml
    """
    if importlib.util.find_spec("streamlit") is None or importlib.util.find_spec("plotly") is None:
        raise MeshplanError("the web app needs streamlit and plotly: pip install 'meshplan[ui]'")
    from meshplan.estimator import data_files
    from meshplan.estimator.stack import load_stack

    load_stack(stack)  # a bad name or file: one line here, not in the browser
    if data_files.names_a_file(stack):
        stack = str(Path(stack).resolve())
    cmd = streamlit_command(port, address)
    check_port_free(port, address)
    os.environ["MESHPLAN_STACK"] = stack  # read by the app (ui/streamlit_app.py), which this process becomes
    typer.echo(f"meshplan web: serving on http://{address or '0.0.0.0'}:{port} (Ctrl-C stops)", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # Streamlit replaces this process (same pid): a signal sent to `meshplan web` (SIGTERM from a job
    # scheduler, Ctrl-C) reaches the server itself, and no orphan is left holding the port.
    os.execv(cmd[0], cmd)
