"""``report --where`` is a parsed filter: it can neither write nor widen its scope (issue 10.1).

Run against a real SQLite file and the real PostgreSQL test server with the injection strings
found when perfsweep was tried with bad input on purpose.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import text

from perfsweep import store
from perfsweep.cli import UserError
from perfsweep.results import load_runs
from perfsweep.where import WhereError, parse_where
from tests.util import new_db_url, run_row


@pytest.fixture(params=["sqlite", "postgres"])
def two_sweeps(request: pytest.FixtureRequest, tmp_path: Path):
    """(engine, first sweep id, second sweep id): two runs in each sweep."""
    engine = store.connect(new_db_url(request, tmp_path))
    ids = []
    for name in ("mine", "theirs"):
        sid = store.get_or_create_sweep(engine, f"/sweeps/{name}", name)
        ids.append(sid)
        for amp, batch in ((True, 4), (False, 8)):
            started = datetime(2026, 11, batch, 9, 30, tzinfo=timezone.utc)  # 4th and 8th of November
            store.save_run(engine, run_row(sid, amp=amp, batch=batch, model_name="it's", started_at=started))
    yield engine, ids[0], ids[1]
    engine.dispose()


def tokens(engine) -> list[float]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT tokens_per_s FROM runs ORDER BY id")).scalars())


@pytest.mark.parametrize(
    "where",
    [
        "1=1; UPDATE runs SET tokens_per_s=0; COMMIT; SELECT 1 WHERE 1=1",
        "amp=1) OR (1=1",
        "amp=1 OR 1=1",
        "batch > (SELECT 0)",
        "batch > 0; DROP TABLE runs",
        "batch > 0 -- comment",
        "length(model_name) > 0",
        "sweep_id IN (SELECT id FROM sweeps)",
    ],
)
def test_injection_is_refused_and_changes_nothing(two_sweeps, where):
    engine, mine, _ = two_sweeps
    before = tokens(engine)
    with pytest.raises(UserError, match=r"^--where ") as err:
        load_runs(engine, [mine], where)
    assert "\n" not in str(err.value)
    assert tokens(engine) == before == [1000.0] * 4


@pytest.mark.parametrize(
    ("where", "batches"),
    [
        ("amp = 1", [4]),
        ("amp = true AND batch >= 4", [4]),
        ("amp != true", [8]),
        ("batch IN (8, 16)", [8]),
        ("batch NOT IN (8)", [4]),
        ("batch BETWEEN 5 AND 9", [8]),
        ("NOT (batch > 4) OR amp = 0", [4, 8]),
        ("model_name = 'it''s'", [4, 8]),
        ("model_name LIKE 'it%' AND status IS NOT NULL", [4, 8]),
        ("error IS NULL AND seq_len <= 512.0", [4, 8]),
        ("batch > '4'", [8]),  # a number in quotes is that number, as SQLite and PostgreSQL read it
        ("batch LIKE '4%'", [4]),  # a pattern on a number column: refused once by the number check
        ("amp LIKE '1' OR amp LIKE 'true'", [4]),  # SQLite writes true as 1, PostgreSQL as true
        ("started_at > '2026-11-05'", [8]),  # was "'str' object has no attribute 'tzinfo'"
        ("started_at BETWEEN '2026-11-04' AND '2026-11-04 10:00'", [4]),
    ],
)
def test_filters_stay_inside_the_sweep(two_sweeps, where, batches):
    engine, mine, theirs = two_sweeps
    df = load_runs(engine, [mine], where)
    assert sorted(df["batch"]) == batches
    assert set(df["sweep_id"]) == {mine}  # never a row of the other sweep
    assert len(load_runs(engine, [mine, theirs], where)) == 2 * len(batches)


def test_a_filter_nested_100_deep_is_read():
    """The limit is 100 parentheses or NOTs, not 99."""
    for where in ("(" * 100 + "amp = 1" + ")" * 100, "NOT " * 100 + "amp = 1"):
        assert parse_where(where, store.Run.__table__) is not None


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("", "empty filter"),
        ("bacth > 4", "unknown column 'bacth'; did you mean batch?"),
        # it exists: "unknown" sent a user looking for a typo
        ("config_json = '{}'", "column 'config_json' cannot be filtered here; filter on a setting's own column"),
        ("batch >", "expected a number, 'text', true or false after batch but found the end"),
        ("amp = 2", "amp is true/false (or 1/0), not 2"),
        # SQL compares a number with a text without a word: this held for every run
        ("seq_len <= 'abc'", "seq_len is a number, not the text 'abc'"),
        ("model_name = 5", "model_name is text, not 5; quote it: model_name = '5'"),
        ("(select 1) = 1", "a subquery (SELECT) is not allowed"),  # was "unknown column 'select'"
        ("started_at > 'yesterday'", "started_at is a time: write it as '2026-11-27' or '2026-11-27 09:30'"),
        ("started_at > 2026", "started_at is a time: write it as '2026-11-27'"),  # was an AttributeError on 'int'
        ("finished_at > true", "finished_at is a time"),
        ("batch 4", "expected a comparison"),
        ("batch > 4 AND", "expected a runs column but found the end"),
        ("(batch > 4", "expected ) but found the end"),
        ("batch > 4;", "unexpected ';' (one filter, no statements)"),
        ("lower(model_name) = 'x'", "function calls are not allowed (lower(...)); compare a runs column as stored"),
        ("batch > 4 OR abs(batch) = 3", "function calls are not allowed (abs(...))"),
        # nested past Python's recursion limit: a RecursionError traceback
        ("(" * 500 + "amp = 1" + ")" * 500, "nested over 100 deep"),
        ("NOT " * 2000 + "amp = 1", "nested over 100 deep"),
    ],
)
def test_bad_filters_get_one_line(where, message):
    with pytest.raises(WhereError, match=None) as err:
        parse_where(where, store.Run.__table__, skip=frozenset({"config_json"}))
    assert message in str(err.value) and "\n" not in str(err.value)
