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
# seconds each file took on the H100 machine of 2026-11-27 (8 workers), where the suite is
# tightest (tests/fixtures/h100-2026-11-27/junit.xml): test_sweep 380, test_bad_input 319,
# test_custom_model 299, test_cpu_isa 294, test_start_method 267, test_compile_cache 232,
# test_scale_out 221, test_lifecycle 215, test_kept_results 203, test_gpu 156, test_report 135,
# test_audit 128, test_stop 94, test_search 81; the rest under 30 each. test_lifecycle,
# test_kept_results and test_stop were one file then, and test_compile_cache with test_cpu_isa
# another: 512 s and 526 s, both unfinished when the run's 550 s were up. (The 3 tests they had
# left took 15 s in test_cpu_isa, 31 s in test_kept_results and 19 s in test_stop, in a second
# call; the fixture holds the first call alone.) Dealt in this order to 8 workers, that run's
# seconds end at 418 s, as in the best order (3,182 over 8: 398): `python
# benchmarks/suite_order.py tests/fixtures/h100-2026-11-27/junit.xml`, and test_layout.py checks
# it. Files not named follow, in their own order.
LONGEST_FIRST = (
    "test_sweep",
    "test_bad_input",
    "test_custom_model",
    "test_cpu_isa",
    "test_start_method",
    "test_compile_cache",
    "test_scale_out",
    "test_lifecycle",
    "test_kept_results",
    "test_gpu",
    "test_report",
    "test_audit",
    "test_stop",
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
