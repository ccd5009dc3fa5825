"""How numbers are written in the charts, report.md and compare.md: one place for units and text.

A value's unit follows from its column's name (:func:`unit`: ``peak_mem_bytes`` is in bytes);
:func:`scale` says how a set of values in a unit is shown (bytes in MiB or GiB by the largest
value, fractions in %), so an axis label, a bar's label and a table column never disagree. The
markdown helpers build GitHub tables without pandas' optional ``tabulate`` dependency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from perfsweep.names import ENVIRONMENT_COLUMNS

UNITS = {"_pct": "%", "_bytes": "bytes", "_per_s": "tokens/s", "_fraction": "fraction", "_ms": "ms", "loss": "nats"}
"""The unit of a column, from its name (perfsweep puts units in column names): first match wins."""
LABELS = {"%": "change", "bytes": "peak memory", "tokens/s": "throughput", "ms": "time per step", "nats": "loss"}
LABELS["samples/s"] = "throughput"
RATES = {"tokens": "tokens/s", "samples": "samples/s"}
"""The headline throughput's unit by what the runs count (perfsweep.metrics.rate_unit)."""
SETUP_COLUMNS = ("device_type", *ENVIRONMENT_COLUMNS, "model_name", "data_name", "warmup_steps", "measure_steps")
"""What the environment tables list: where the runs ran, and what they trained for how long."""


def unit(column: str, rate: str = "tokens/s") -> str:
    """The unit of ``column``; a throughput (``_per_s``) is in ``rate``."""
    found = next((u for part, u in UNITS.items() if part in column), "")
    return rate if found == "tokens/s" else found


def for_rate(text: str, rate: str) -> str:
    """``text`` written for a sweep whose throughput is in ``rate`` (the texts say tokens/s)."""
    if rate == "tokens/s":
        return text
    what = rate.split("/")[0]
    return (
        text.replace("tokens/s", rate)
        .replace("Tokens/s", rate.capitalize())
        .replace("Tokens per", f"{what.capitalize()} per")
    )


def scale(unit: str, values: Any) -> tuple[float, str]:
    """(divisor, unit shown) for ``values`` in ``unit``: bytes in GiB from 1 GiB on, else MiB; a
    fraction in percent; any other unit as it is."""
    if unit == "bytes":
        biggest = np.nanmax(np.abs(np.asarray(values, dtype=float)), initial=0.0)
        return (2.0**30, "GiB") if biggest >= 2**30 else (2.0**20, "MiB")
    return (0.01, "%") if unit == "fraction" else (1.0, unit)


def missing(v: Any) -> bool:
    return v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and not np.isfinite(v))


def si(v: Any, digits: int = 3) -> str:
    """14109 -> '14.1k': short enough to write on a bar. Rounded before the suffix is chosen:
    999.6 tokens/s was written '1e+03' beside a cell's '1k', and 999,600 '1e+03k'."""
    if missing(v):
        return "-"
    v = float(f"{v:.{digits}g}")
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.{digits}g}{suffix}"
    return f"{v:.{digits}g}"


def alike(a: float, b: float, digits: int = 3) -> bool:
    """Whether ``a`` and ``b`` lie within half a unit of the last of ``digits`` significant
    digits of the larger, so that :func:`si` cannot tell them apart, or, either side of a rounding
    edge (12,349.9 and 12,350.1: '12.3k' and '12.4k'), by that edge alone."""
    top = max(abs(a), abs(b))
    return top == 0 or abs(a - b) < 0.5 * 10 ** (math.floor(math.log10(top)) - digits + 1)


def num(v: Any, spec: str = "{:,.0f}") -> str:
    return "-" if missing(v) else spec.format(v)


def mem(v: Any, signed: bool = False) -> str:
    """Bytes as text in MiB or GiB, about three significant digits: '4.00 MiB', '+1.5 GiB'."""
    if missing(v):
        return "-"
    div, unit = scale("bytes", [v])
    x = v / div
    return f"{x:{'+' if signed else ''},.{2 if abs(x) < 10 else 1 if abs(x) < 100 else 0}f} {unit}"


def span(lo: Any, hi: Any, spec: str = "{:,.0f}") -> str:
    return "-" if missing(lo) or missing(hi) else f"{spec.format(lo)}-{spec.format(hi)}"


def speedup(value: Any, lo: Any, hi: Any) -> str:
    """'1.23x (1.10-1.35)': a speedup with its 95% interval where it has one. An interval clear of
    1 never reads as touching it: where a bound would print as 1.00, more digits for it and the
    speedup ('1.020x (1.005-1.030)', where '1.02x (1.00-1.03) faster' looked like a tie called a
    win). One that holds 1 keeps two: '1.00x (1.00-1.01)'."""
    if missing(lo) or missing(hi):
        return num(value, "{:.2f}x")
    digits = 2
    clear = lo > 1 or hi < 1  # the verdict says faster or slower: no bound may read as 1
    while clear and digits < 6 and any(f"{b:.{digits}f}" == f"{1:.{digits}f}" for b in (lo, hi)):
        digits += 1
    spec = f"{{:.{digits}f}}"  # the speedup too: '1.00x (1.001-1.005) faster' read as a tie
    return num(value, spec + "x") + f" ({span(lo, hi, spec)})"


def listing(items: Any, n: int, sep: str = ", ") -> str:
    """The first ``n`` of ``items`` joined by ``sep``, saying how many more there are."""
    items = [str(i) for i in items]
    return sep.join(items[:n]) + (f" ... (+{len(items) - n} more)" if len(items) > n else "")


def cell(v: Any) -> str:
    return "-" if missing(v) else str(v).replace("|", "\\|").replace("\n", " ")


def table(df: pd.DataFrame, right: Sequence[str] = ()) -> str:
    """A GitHub markdown table of ``df`` (already formatted as strings where it matters)."""
    head = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---:" if c in right else "---" for c in df.columns) + "|"
    return "\n".join([head, rule, *("| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(False))])


def environment(runs: dict[str, pd.DataFrame]) -> str:
    """A table of the distinct values (at most 4) of each of :data:`SETUP_COLUMNS` that has any, in
    each named set of runs. With two sets, only the rows where they differ, then what they share:
    a difference can explain a difference in the numbers."""
    cols = [c for c in SETUP_COLUMNS if any(r[c].notna().any() for r in runs.values())]
    values = {
        name: [listing(dict.fromkeys(r[c].dropna().astype(str)), 4, "; ") or "-" for c in cols]
        for name, r in runs.items()
    }
    out = pd.DataFrame({"": cols} | values)
    if len(runs) != 2:
        return table(out)
    a, b = ([set(r[c].dropna().astype(str)) for c in cols] for r in runs.values())  # all values, not the 4 shown
    same = pd.Series([x == y for x, y in zip(a, b, strict=True)])
    shared = f"Same in both: {', '.join(out.loc[same, ''])}." if same.any() else ""
    return (table(out[~same]) + "\n\n" if not same.all() else "No differences.\n\n") + shared
