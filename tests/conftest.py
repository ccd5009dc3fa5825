"""Shared fixtures. Sweeps run for real: fresh job processes, a real SQLite file, real traces."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/pg.py: the session-scoped `pg_url` fixture (a throwaway PostgreSQL server)
pytest_plugins = ["tests.pg"]


@pytest.fixture(scope="session", autouse=True)
def token_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One token cache for the whole session, so the stdlib corpus is tokenized at most once.
    pytest-xdist's workers share it: their base folders sit side by side in one parent, and the
    cache is written by rename (perfsweep.data), as for two sweeps started at once."""
    shared = tmp_path_factory.getbasetemp().parent / "token-cache" if os.environ.get("PYTEST_XDIST_WORKER") else None
    path = Path(os.environ.get("PERFSWEEP_TEST_CACHE") or shared or tmp_path_factory.mktemp("token-cache"))
    path.mkdir(parents=True, exist_ok=True)
    os.environ["PERFSWEEP_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def sigint_as_in_a_terminal() -> Iterator[None]:
    """Ctrl-C tests raise a real SIGINT in this process and expect KeyboardInterrupt. A suite
    started in the background (``pytest &``, ``nohup``) inherits SIGINT ignored, and those tests
    failed for that alone; Python's own handler is put back for the session, as in a terminal."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
