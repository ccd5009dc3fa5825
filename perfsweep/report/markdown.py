"""Markdown building blocks: GitHub-flavoured tables and number formats for report.md/compare.md.

pandas' ``to_markdown`` needs the optional ``tabulate`` package; these few lines avoid a
dependency and let us right-align numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from perfsweep.report.charts import bytes_unit, fmt_mem


def cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)) or v is pd.NA or v is pd.NaT:
        return "-"
    return str(v).replace("|", "\\|").replace("\n", " ")


def table(df: pd.DataFrame, right: Sequence[str] = ()) -> str:
    """A GitHub markdown table of ``df`` (already formatted as strings where it matters)."""
    cols = [str(c) for c in df.columns]
    head = "| " + " | ".join(cell(c) for c in cols) + " |"
    rule = "|" + "|".join("---:" if c in right else "---" for c in cols) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def num(v: Any, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None or pd.isna(v) else fmt.format(v)


def tokens_range(lo: Any, hi: Any) -> str:
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return "-"
    return f"{lo:,.0f}-{hi:,.0f}"


def mem_formatter(values: pd.Series) -> tuple[str, Any]:
    """(unit name, function bytes -> text in that unit) for one table column."""
    div, unit = bytes_unit(values)
    return unit, lambda v: "-" if v is None or pd.isna(v) else f"{v / div:,.1f}"


def mem(v: Any) -> str:
    if v is None or pd.isna(v):
        return "-"
    div, unit = bytes_unit([float(v)])
    return fmt_mem(float(v), div, unit)


def first_line(text: Any, width: int = 80) -> str:
    if not isinstance(text, str) or not text.strip():
        return ""
    line = text.strip().splitlines()[0]
    return line if len(line) <= width else line[: width - 3] + "..."
