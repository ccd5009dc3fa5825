"""``--where``: a filter over ``runs`` columns, parsed into a SQLAlchemy expression.

The filter text never reaches the database as SQL. It is parsed into comparisons of a known
``runs`` column with a literal, joined by AND, OR, NOT and parentheses; the literals are bound
parameters. So a filter can neither write (``1=1; UPDATE runs ...``) nor widen its scope past
the sweep it filters (``amp=1) OR (1=1``): such input is refused with one line saying why.

Grammar (keywords in any case)::

    expr       := term (OR term)*
    term       := factor (AND factor)*
    factor     := NOT factor | '(' expr ')' | comparison
    comparison := column op value
                | column IS [NOT] NULL
                | column [NOT] IN '(' value (',' value)* ')'
                | column [NOT] LIKE 'pattern'
                | column [NOT] BETWEEN value AND value
    op         := = | == | != | <> | < | <= | > | >=
    value      := number | 'text' | "text" | true | false
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    DateTime,
    Float,
    Integer,
    String,
    Table,
    Text,
    TypeDecorator,
    and_,
    cast,
    not_,
    or_,
)

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<num>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)
      | (?P<str>'(?:[^']|'')*'|"(?:[^"]|"")*")
      | (?P<op><=|>=|<>|!=|==|=|<|>)
      | (?P<punct>[(),])
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<bad>\S)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "is", "null", "in", "like", "between", "true", "false"}
_OPS: dict[str, Callable[[Any, Any], ColumnElement]] = {
    "=": lambda c, v: c == v,
    "==": lambda c, v: c == v,
    "!=": lambda c, v: c != v,
    "<>": lambda c, v: c != v,
    "<": lambda c, v: c < v,
    "<=": lambda c, v: c <= v,
    ">": lambda c, v: c > v,
    ">=": lambda c, v: c >= v,
}


MAX_NESTING = 100
"""Deepest parentheses and NOTs a filter may nest: far beyond any written by hand."""


class WhereError(ValueError):
    """The filter cannot be parsed; the message says where and what is allowed."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind is None:
            continue
        value = m.group(kind)
        if kind == "bad":
            hint = " (one filter, no statements)" if value == ";" else ""
            raise WhereError(f"unexpected {value!r}{hint}")
        if kind == "word" and value.lower() in _KEYWORDS:
            kind, value = "kw", value.lower()
        out.append((kind, value))
    return out


class _Parser:
    def __init__(self, text: str, table: Table, skip: frozenset[str]) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0  # of parentheses and NOTs around the current factor
        self.table = table
        self.columns = [c.name for c in table.columns if c.name not in skip]

    # -- token helpers -------------------------------------------------------------------
    def peek(self, kind: str, value: str | None = None) -> bool:
        if self.i >= len(self.toks):
            return False
        k, v = self.toks[self.i]
        return k == kind and (value is None or v == value)

    def found(self) -> str:
        """What stands at the current position, for error messages."""
        return repr(self.toks[self.i][1]) if self.i < len(self.toks) else "the end"

    def take(self, kind: str, value: str | None = None) -> str:
        if not self.peek(kind, value):
            raise WhereError(f"expected {value or kind} but found {self.found()}")
        self.i += 1
        return self.toks[self.i - 1][1]

    def accept(self, kind: str, value: str | None = None) -> bool:
        if self.peek(kind, value):
            self.i += 1
            return True
        return False

    # -- grammar -------------------------------------------------------------------------
    def parse(self) -> ColumnElement:
        if not self.toks:
            raise WhereError("empty filter")
        expr = self.expr()
        if self.i < len(self.toks):
            raise WhereError(f"unexpected {self.toks[self.i][1]!r} after a complete filter")
        return expr

    def expr(self) -> ColumnElement:
        parts = [self.term()]
        while self.accept("kw", "or"):
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else or_(*parts)

    def term(self) -> ColumnElement:
        parts = [self.factor()]
        while self.accept("kw", "and"):
            parts.append(self.factor())
        return parts[0] if len(parts) == 1 else and_(*parts)

    def factor(self) -> ColumnElement:
        if (
            self.depth > MAX_NESTING
        ):  # (the comparison inside is a factor too) Python's own recursion limit came first: a RecursionError traceback
            raise WhereError(f"parentheses and NOTs nested over {MAX_NESTING} deep; write the filter flatter")
        self.depth += 1
        try:
            if self.accept("kw", "not"):
                return not_(self.factor())
            if self.accept("punct", "("):
                inner = self.expr()
                self.take("punct", ")")
                return inner
            return self.comparison()
        finally:
            self.depth -= 1

    def column(self) -> Any:
        if not self.peek("word"):
            raise WhereError(f"expected a runs column but found {self.found()}")
        name = self.take("word")
        if name.lower() == "select":
            raise WhereError(
                "a subquery (SELECT) is not allowed; compare runs columns, or use perfsweep query for full SQL"
            )
        if self.peek("punct", "("):  # lower(name), abs(x): the filter compares columns as stored
            raise WhereError(
                f"function calls are not allowed ({name}(...)); compare a runs column as stored, "
                "e.g. name LIKE 'x%', or use perfsweep query for full SQL"
            )
        if name not in self.columns and name in self.table.c:  # config_json: a JSON text, not a setting
            raise WhereError(
                f"column {name!r} cannot be filtered here; filter on a setting's own column (amp, batch, "
                f"model_name), or use perfsweep query with json_extract({name}, '$.key') for full SQL"
            )
        if name not in self.columns:
            close = difflib.get_close_matches(name, self.columns, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see the runs table in the README"
            raise WhereError(f"unknown column {name!r}; {hint}")
        return self.table.c[name]

    def value(self, col: Any, like: bool = False) -> Any:
        if self.peek("num"):
            text = self.take("num")
            v: Any = float(text) if any(ch in text for ch in ".eE") else int(text)
        elif self.peek("str"):
            raw = self.take("str")
            v = raw[1:-1].replace(raw[0] * 2, raw[0])
        elif self.peek("kw", "true") or self.peek("kw", "false"):
            v = self.take("kw") == "true"
        else:
            raise WhereError(f"expected a number, 'text', true or false after {col.name} but found {self.found()}")
        if like:  # a pattern, on any column (batch LIKE '4%' matched before; amp LIKE '1' met the true/false check)
            return v
        if isinstance(col.type, Boolean) and not isinstance(v, bool):
            if v not in (0, 1):
                raise WhereError(f"{col.name} is true/false (or 1/0), not {v!r}")
            v = bool(v)
        kind = col.type.impl if isinstance(col.type, TypeDecorator) else col.type
        if isinstance(kind, DateTime):  # was "'str' object has no attribute 'tzinfo'" (or 'int', 'bool')
            with contextlib.suppress(ValueError):
                if isinstance(v, str):
                    return datetime.fromisoformat(v)
            raise WhereError(f"{col.name} is a time: write it as '2026-11-27' or '2026-11-27 09:30', not {v!r}")
        # SQL compares a number with a text without a word: seq_len <= 'abc' held for every run (SQLite
        # orders every number before every text), model_name = 5 for none
        if isinstance(kind, (Integer, Float)) and isinstance(v, str):
            try:  # '128' is 128, as SQLite's column affinity and PostgreSQL's cast read it
                v = int(v) if re.fullmatch(r"\s*[-+]?\d+\s*", v) else float(v)
            except ValueError:
                raise WhereError(f"{col.name} is a number, not the text {v!r}") from None
        if isinstance(kind, (String, Text)) and not isinstance(v, str):
            raise WhereError(f"{col.name} is text, not {v!r}; quote it: {col.name} = '{v}'")
        return v

    def comparison(self) -> ColumnElement:
        col = self.column()
        if self.accept("kw", "is"):
            negate = self.accept("kw", "not")
            self.take("kw", "null")
            return col.is_not(None) if negate else col.is_(None)
        negate = self.accept("kw", "not")
        if self.accept("kw", "in"):
            self.take("punct", "(")
            values = [self.value(col)]
            while self.accept("punct", ","):
                values.append(self.value(col))
            self.take("punct", ")")
            expr = col.in_(values)
        elif self.accept("kw", "like"):
            if not self.peek("str"):
                raise WhereError(f"LIKE needs a quoted pattern after {col.name}")
            pattern = self.value(col, like=True)  # a number column as its text: PostgreSQL has no integer LIKE
            expr = (col if isinstance(col.type, (String, Text)) else cast(col, String)).like(pattern)
        elif self.accept("kw", "between"):
            lo = self.value(col)
            self.take("kw", "and")
            expr = col.between(lo, self.value(col))
        elif negate:
            raise WhereError(f"NOT after {col.name} must be followed by IN, LIKE or BETWEEN")
        else:
            if not self.peek("op"):
                raise WhereError(
                    f"expected a comparison (=, !=, <, <=, >, >=, IS, IN, LIKE) after "
                    f"{col.name} but found {self.found()}"
                )
            op = self.take("op")
            return _OPS[op](col, self.value(col))
        return not_(expr) if negate else expr


def parse_where(text: str, table: Table, skip: frozenset[str] = frozenset()) -> ColumnElement:
    """The SQLAlchemy expression for ``text`` over ``table``'s columns (minus ``skip``)."""
    return _Parser(text, table, skip).parse()
