"""Unit tests run no subprocess: the mock server runs in this process (a greenlet under gevent).

Global state the plugin patches (Locust's stats buckets, the options hidden from the web UI) is put
back after every test, so no test passes or fails because of the one before it.
"""

import sys

import pytest

from vllm_locust.mock.server import start_in_thread


@pytest.fixture(scope="session")
def mock_server_session():
    server = start_in_thread()
    yield server
    server.stop()


@pytest.fixture
def fake_server(mock_server_session):
    """The in-process mock server, reset to its default script."""
    mock_server_session.configure()
    return mock_server_session


def _web_ui_hidden():
    options = sys.modules.get("vllm_locust.plugin.options")
    return getattr(options, "WEB_UI_HIDDEN", None)


@pytest.fixture(autouse=True)
def no_global_patch_outlives_its_test():
    """Undo ``buckets.install()`` and changes to ``options.WEB_UI_HIDDEN`` after each test (modules
    not yet imported were not patched: nothing to undo)."""
    hidden = _web_ui_hidden()
    hidden_before = set(hidden) if hidden is not None else set()
    yield
    buckets = sys.modules.get("vllm_locust.plugin.records.buckets")
    if buckets is not None:
        buckets.uninstall()
    hidden = _web_ui_hidden()
    if hidden is not None:
        hidden.clear()
        hidden.update(hidden_before)
