"""``perfsweep upgrade --db DB``: bring a results database's schema to this perfsweep's version.

Reading commands (report, query) never change a database; this is the one command that
upgrades one on purpose. Alembic migrations only add: no table, column or row is dropped.
"""

from __future__ import annotations

import sys

from perfsweep import store
from perfsweep.cli import OneLineParser, waiting_for_database


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="perfsweep upgrade", description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="results.db", help="SQLite file or SQLAlchemy URL (default: %(default)s)")
    args = parser.parse_args(argv)
    from perfsweep.cli import UserError, first_line

    db = store.hide_password(args.db)
    try:
        url = store.existing_url(args.db)
        store.refuse_damage(url)  # the file, before its schema revision is read
        probe = store.make_engine(url)
        before = store.schema_revision(probe)
        probe.dispose()
        with waiting_for_database(url):
            engine = store.connect(url)
        after = store.schema_revision(engine)
        store.refuse_damage(url, engine)  # the schema, once at the current revision
        engine.dispose()
    except store.DamagedDatabase as exc:
        print(f"perfsweep upgrade: --db {db}: {exc}", file=sys.stderr)
        return 2
    except UserError as exc:
        print(f"perfsweep upgrade: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # read-only file, server unreachable, not a database...
        print(f"perfsweep upgrade: --db {db}: cannot upgrade ({first_line(exc)})", file=sys.stderr)
        return 2  # as every command answers a database it cannot use
    print(f"{db}: schema {before or '(new)'} -> {after}" if before != after else f"{db}: schema already at {after}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
