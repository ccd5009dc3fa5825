"""Shared fixtures. Sweeps run for real: fresh job processes, a real SQLite file, real traces."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfsweep.names import STACKS_ENV

# tests/pg.py: the session-scoped `pg_url` fixture (a throwaway PostgreSQL server)
pytest_plugins = ["tests.pg"]


def _share_the_cores() -> None:
    """Each pytest-xdist worker's jobs get its share of the cores. Each job otherwise starts
    torch's default thread count (every core), so 2 workers on 2 cores ran 4 busy threads, and 4
    workers on a 16-core GPU machine ran 64. The spinning OpenMP threads slowed the suite: on 2
    cores, test_sweep.py with test_lifecycle.py took 187 s this way against 223 s. A job's
    OMP_NUM_THREADS is torch's default thread count. A value the user set is kept; a test that
    sets ``threads`` or gives a job a launcher slot still gets what it asks for."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


_share_the_cores()  # before any job starts, and before this process imports torch: its tests share too
os.environ.setdefault(STACKS_ENV, "1")  # tests.util.finish asks a stuck sweep where it waits


@pytest.fixture(scope="session", autouse=True)
def token_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One token cache for the whole session, so the stdlib corpus is tokenized at most once.
    pytest-xdist's workers share it: their base folders sit side by side in one parent, and the
    cache is written by rename (perfsweep.corpus), as for two sweeps started at once. New results
    files are copied from the schema template kept there too (perfsweep.store.schema_template)."""
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


# The order pytest-xdist deals test files out in (pyproject: --dist loadfile --no-loadscope-reorder):
# longest first, so that no long file is dealt last and sets the suite's end alone. xdist's own
# order, most tests first, dealt test_sweep.py (17 tests) after twenty short files. Ordered by the
# seconds each file took on the H200 machine of 2026-11-28 (8 workers), where the suite is
# tightest (tests/fixtures/h200-2026-11-28/junit.xml): test_sweep 426, test_bad_input 425,
# test_start_method 334, test_custom_model 322, test_lifecycle 320, test_cpu_isa 319,
# test_kept_results 283, test_scale_out 228, test_compile_cache 221, test_gpu 145, test_report
# 130, test_audit 114, test_stop 107, test_lost_output 73, test_search 69; the rest under 65 each.
# test_interrupts was dealt last of the unnamed files there and cut off by the run's limit after
# 42 s: on this 2-core VM it takes 59 s, and the H200 ran the same tests 2.9 times slower (the
# median), so it goes where about 170 s would. `python benchmarks/suite_order.py
# tests/fixtures/h200-2026-11-28/junit.xml` prints those seconds and the order's end on them, and
# test_layout.py checks it. Files not named follow, in their own order.
LONGEST_FIRST = (
    "test_sweep",
    "test_bad_input",
    "test_start_method",
    "test_custom_model",
    "test_lifecycle",
    "test_cpu_isa",
    "test_kept_results",
    "test_scale_out",
    "test_compile_cache",
    "test_interrupts",
    "test_gpu",
    "test_report",
    "test_audit",
    "test_stop",
    "test_lost_output",
    "test_search",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Sort the tests by their file's place in LONGEST_FIRST (a stable sort: a file's own tests
    keep their order); xdist deals files out in the order their first test is collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``PERFSWEEP_TEST_FAILURES=FILE``, each failure's traceback is appended to FILE when it
    happens, not in the summary at the end: a suite cut off at a time limit (a lent GPU's
    minutes) keeps the tracebacks of what failed before. Written by the controller alone (an
    xdist worker's report reaches it too)."""
    path = os.environ.get("PERFSWEEP_TEST_FAILURES")
    if path and report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
