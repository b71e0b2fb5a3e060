"""Smoke test: the TUI in a real terminal, as a person over SSH would use it: tmux at 80x24, keys in,
the screen read back with capture-pane. Runs `python -m ui.tui` (the module `meshplan tui` starts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from needs import require, require_module

require_module("textual")

pytestmark = pytest.mark.serial  # screens compared frame by frame: run alone (make test's second part)
ROOT = Path(__file__).resolve().parents[2]
TMUX = shutil.which("tmux") or ("/usr/bin/tmux" if os.path.exists("/usr/bin/tmux") else None)


class Tmux:
    def __init__(self, name: str):
        self.base = [TMUX, "-L", name, "-f", "/dev/null"]
        self.session = name

    def run(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=30).stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.run("send-keys", "-t", self.session, *(["-l"] if literal else []), *keys)
        time.sleep(0.4)  # a person's pace: tmux would otherwise glue esc to the next key (alt+key)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.session)

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.25)
        raise AssertionError(f"{text!r} never appeared; the screen:\n{self.screen()}")


@pytest.mark.slow
def test_tui_in_tmux_80x24(tmp_path):
    require(TMUX is not None, "tmux is not installed (apt-get install tmux)")
    name = f"meshplan-tui-{os.getpid()}"
    tmux = Tmux(name)
    out = tmp_path / "exported"
    cmd = f"cd {ROOT} && {sys.executable} -m ui.tui --model llama3-8b --nodes 1; echo TUI-EXIT=$?; sleep 30"
    tmux.run("new-session", "-d", "-s", name, "-x", "80", "-y", "24", cmd)
    try:
        tmux.wait_for(" fit")  # the title: "... · N/M fit"
        screen = tmux.wait_for("q quit")  # the footer can paint a frame after the title on a loaded machine
        lines = screen.splitlines()
        assert len(lines) == 24 and all(len(line) <= 80 for line in lines)
        assert "llama3-8b · 1x8 h100-sxm" in lines[0]
        assert "Plans" in screen and "tok/s" in screen and "per GPU" in screen and "q quit" in lines[-1]

        tmux.keys("t")
        screen = tmux.wait_for("1. FSDP")
        tmux.keys("Enter")
        tmux.wait_for("├── → ")

        tmux.keys("p")
        tmux.keys("e")
        tmux.wait_for("Export the chosen plan")
        tmux.keys(str(out), literal=True)  # replaces the selected default directory
        tmux.keys("Enter")
        tmux.wait_for("wrote 6 files")
        assert len(list(out.iterdir())) == 6
        tmux.keys("Escape")
        tmux.wait_for("q quit")

        tmux.keys("f")  # into the form: a bad value is explained under it
        tmux.keys("Tab")
        tmux.keys("Tab")
        tmux.keys("Tab")
        tmux.keys("x", literal=True)
        tmux.keys("Enter")
        tmux.wait_for("nodes: 'x' is not a number")
        tmux.keys("Escape")
        tmux.keys("q")
        tmux.wait_for("TUI-EXIT=0", timeout=20)
    finally:
        tmux.run("kill-server")
