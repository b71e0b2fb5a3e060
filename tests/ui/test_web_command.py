"""`meshplan web`: the command line it runs, without starting a server."""

from __future__ import annotations

import socket
import sys

import pytest
from needs import require_module

from meshplan.commands import web
from meshplan.estimator.errors import MeshplanError


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_web_cmd_execs_streamlit(monkeypatch):
    """Streamlit replaces the meshplan process (os.execv): a SIGTERM to `meshplan web` reaches the server."""
    seen = []
    monkeypatch.setattr(web.os, "execv", lambda path, argv: seen.append((path, argv)))
    monkeypatch.setenv("MESHPLAN_STACK", "torchtitan")  # restored after the test: the command sets it
    port = free_port()
    web.web_cmd(port=port, address="127.0.0.1", stack="torchtitan")
    cmd = web.streamlit_command(port, "127.0.0.1")
    assert seen == [(cmd[0], cmd)] and cmd[0] == sys.executable


@pytest.mark.parametrize("address", ["127.0.0.1", None])
def test_busy_port_is_a_one_line_error(cli, address):
    """The port is checked before `serving on ...` is printed or Streamlit starts: one line, exit 2."""
    require_module("streamlit")
    require_module("plotly")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = cli("web", "--port", str(port), *(["--address", address] if address else []), timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.startswith("meshplan: error: ") and out.stderr.count("\n") == 1, out.stderr
    assert f"{port} is in use" in out.stderr and "--port N" in out.stderr
    assert "serving on" not in out.stderr + out.stdout and "Traceback" not in out.stderr


def test_check_port_free_accepts_a_free_port_and_rejects_a_bad_address():
    web.check_port_free(free_port(), "127.0.0.1")
    with pytest.raises(MeshplanError, match="--address"):
        web.check_port_free(free_port(), "no-such-host.invalid")


def test_web_is_registered_in_the_cli():
    from meshplan.cli import COMMANDS, load_command

    assert "web" in COMMANDS, "register it in meshplan/cli.py's COMMANDS"
    assert load_command("web").name == "web"


def test_web_listens_on_this_machine_only_unless_asked(monkeypatch):
    from typer.testing import CliRunner

    from meshplan.cli import app

    require_module("streamlit")
    require_module("plotly")
    seen = []
    monkeypatch.setattr(web.os, "execv", lambda path, argv: seen.append(argv))
    monkeypatch.setenv("MESHPLAN_STACK", "torchtitan")  # restored after the test: the command sets it
    port = free_port()
    result = CliRunner().invoke(app, ["web", "--port", str(port)])
    assert result.exit_code == 0, result.output
    opts = dict(zip(seen[0][5::2], seen[0][6::2], strict=True))
    assert opts["--server.address"] == "127.0.0.1"
    CliRunner().invoke(app, ["web", "--port", str(port), "--address", "0.0.0.0"])
    assert dict(zip(seen[1][5::2], seen[1][6::2], strict=True))["--server.address"] == "0.0.0.0"


def test_web_stack_reaches_the_app_as_an_absolute_path(monkeypatch, tmp_path):
    """`meshplan web --stack FILE` hands the app (MESHPLAN_STACK, inherited through execv) the file's absolute path;
    a built-in id as it is; an unknown one is refused in one line before anything starts."""
    from typer.testing import CliRunner

    from meshplan.cli import app

    require_module("streamlit")
    require_module("plotly")
    (tmp_path / "mine.yaml").write_text("id: mine\nextends: torchtitan\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MESHPLAN_STACK", "torchtitan")  # restored (unset) after the test: the command sets it
    seen = []
    monkeypatch.setattr(web.os, "execv", lambda path, argv: seen.append(web.os.environ["MESHPLAN_STACK"]))
    port = free_port()
    assert CliRunner().invoke(app, ["web", "--port", str(port), "--stack", "mine.yaml"]).exit_code == 0
    assert CliRunner().invoke(app, ["web", "--port", str(port), "--stack", "llm-foundry"]).exit_code == 0
    assert seen == [str(tmp_path / "mine.yaml"), "llm-foundry"]
    bad = CliRunner().invoke(app, ["web", "--port", str(port), "--stack", "nope"])
    assert bad.exit_code != 0 and "unknown stack profile 'nope'" in str(bad.exception) and len(seen) == 2
