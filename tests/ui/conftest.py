"""Fixtures of the web app tests (all named web_*): an AppTest factory and a recorder of download files."""

from __future__ import annotations

from pathlib import Path

import pytest
from needs import require_module

APP = Path(__file__).resolve().parents[2] / "ui" / "streamlit_app.py"


@pytest.fixture
def web_app():
    """`web_app(view=None, **state)`: an AppTest of ui/streamlit_app.py with session state preset, run once."""
    require_module("streamlit")
    from streamlit.testing.v1 import AppTest

    def make(view: str | None = None, **state) -> AppTest:
        at = AppTest.from_file(str(APP), default_timeout=120)
        for k, v in state.items():
            at.session_state[k] = v
        if view:
            at.session_state["view"] = view
        return at.run()

    return make


@pytest.fixture
def web_downloads(monkeypatch):
    """Records what the app hands to download buttons: {file_name: bytes or a zero-argument callable}."""
    from streamlit.runtime.media_file_manager import MediaFileManager

    files: dict = {}
    add, add_deferred = MediaFileManager.add, MediaFileManager.add_deferred

    def record_add(self, path_or_data, mimetype, coordinates, file_name=None, **kw):
        if file_name is not None:
            files[file_name] = path_or_data
        return add(self, path_or_data, mimetype, coordinates, file_name=file_name, **kw)

    def record_deferred(self, data_callable, mimetype, coordinates, file_name=None, **kw):
        files[file_name] = data_callable
        return add_deferred(self, data_callable, mimetype, coordinates, file_name=file_name, **kw)

    monkeypatch.setattr(MediaFileManager, "add", record_add)
    monkeypatch.setattr(MediaFileManager, "add_deferred", record_deferred)
    return files
