"""Unit tests run no subprocess: the mock server runs in this process (a greenlet under gevent)."""

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
