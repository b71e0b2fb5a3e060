"""`meshplan web`: the command line it runs, without starting a server."""

from __future__ import annotations

import sys

import pytest

from estimator.errors import MeshplanError
from meshplan.commands import web


def test_app_path_is_the_installed_ui_package_file():
    path = web.app_path()
    assert path.name == "streamlit_app.py" and path.parent.name == "ui" and path.is_file()


def test_streamlit_command_is_headless_on_the_port():
    cmd = web.streamlit_command(8599)
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"]
    assert cmd[4] == str(web.app_path())
    opts = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert opts["--server.headless"] == "true" and opts["--server.port"] == "8599"
    assert "--server.address" not in opts
    assert web.streamlit_command(8599, "127.0.0.1")[-2:] == ["--server.address", "127.0.0.1"]


def test_bad_port_is_a_one_line_error():
    with pytest.raises(MeshplanError, match="--port"):
        web.streamlit_command(70000)


def test_web_cmd_runs_streamlit(monkeypatch):
    seen = []
    monkeypatch.setattr(web.subprocess, "call", lambda cmd: seen.append(cmd) or 0)
    web.web_cmd(port=8600, address=None)
    assert seen == [web.streamlit_command(8600)]


def test_web_is_registered_in_the_cli():
    from meshplan.cli import app

    names = {c.name for c in app.registered_commands}
    assert "web" in names, "register it in meshplan/cli.py: app.command('web')(web.web_cmd)"
