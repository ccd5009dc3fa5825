"""The code's shape, checked: no import cycle, light modules stay light, figures have one home.

These read the source with ``ast`` and ``re``; nothing is imported, so a cycle or a heavy import
is found even where it would only bite at run time (imports inside functions count too).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from tests.util import REPO

PACKAGES = ("perfsweep", "hydra_plugins")
GENERATED = "perfsweep/migrations/versions"


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of perfsweep and its Hydra plugin."""
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            rel = path.relative_to(REPO)
            if rel.as_posix().startswith(GENERATED):
                continue
            name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            out[name] = path
    return out


def imported_names(path: Path, module: str) -> set[str]:
    """Every module name ``path`` imports, anywhere in the file (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from x import y`` counts x.y when y is a module)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges = set()
        for target in imported_names(path, name):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    """The checker itself: a planted three-module cycle is reported, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle():
    graph = import_graph()
    assert "perfsweep.runner" in graph and "hydra_plugins.perfsweep_sweeper" in graph  # the walk saw the package
    assert cycles(graph) == []


def _third_party(path: Path, module: str) -> set[str]:
    return {n.split(".")[0] for n in imported_names(path, module)} - set(sys.stdlib_module_names) - {"__future__"}


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        # the shared vocabulary: importable by the CLI, the trace reader and the report without torch
        ("perfsweep.names", set()),
        ("perfsweep.cli", set()),
        # how a sweep stops: the entry point and the summary hold signals before torch is imported
        ("perfsweep.interrupts", set()),
        ("perfsweep.trace", {"perfsweep"}),
        ("perfsweep.metrics", {"perfsweep", "numpy"}),  # the job process imports it; pandas is not needed
        # configs: the summary's and the report's shared grouping, without matplotlib or torch
        ("perfsweep.configs", {"perfsweep", "numpy", "pandas"}),
        # the memory ledger is arithmetic: the launcher, the report and a notebook can predict without torch
        ("perfsweep.ledger", set()),
        # config imports only what it validates with: Hydra's schema store and OmegaConf
        ("perfsweep.config", {"hydra", "omegaconf"}),
        # the sweeper starts the job server with it before the sweep imports torch (test below)
        ("perfsweep.job_start", {"perfsweep"}),
        # the cgroup reader: the sweep plans cores with it and job_start gates the server by it
        ("perfsweep.cgroups", set()),
    ],
)
def test_light_modules_stay_light(module: str, allowed: set[str]):
    path = modules()[module]
    assert _third_party(path, module) <= allowed
    if module == "perfsweep.config":
        assert not {n for n in imported_names(path, module) if n.startswith(("perfsweep", "hydra_plugins"))}


def test_the_job_server_starts_before_torch_is_imported():
    """perfsweep.job_start, with all it imports, leaves torch out: the server's imports of torch
    overlap the sweep's own only if the sweep has not begun them when it starts the server."""
    import subprocess

    script = (
        "import sys, perfsweep.job_start; print(sorted(m for m in ('torch', 'numpy', 'pandas') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr


FIGURE = re.compile(r"tokens_per_s(?!tep)\w*\W{0,3} =|samples_per_s\W{0,3} =|/ \S*step_time|> NOISY|> 1\.5\b")
"""How a derived figure is computed: a throughput assigned, a division by a step time, the noise rule."""


def test_derived_figures_have_one_home():
    """Every derived figure is computed in perfsweep.metrics (issue 11: one home per figure)."""
    hits = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in modules().values()
        if path.name != "metrics.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if FIGURE.search(line) and not line.lstrip().startswith(("#", '"', "f'", "'"))
    ]
    assert hits == []
    assert FIGURE.search((REPO / "perfsweep/metrics.py").read_text())  # the pattern does match figure code


def test_the_suite_deals_its_longest_files_first(monkeypatch: pytest.MonkeyPatch):
    """tests/conftest.py's LONGEST_FIRST names test files that exist, and on the seconds the H200
    machine's run of 2026-11-28 measured (tests/fixtures/h200-2026-11-28), the order ends within 5%
    of the best order those seconds allow. A renamed file, or one that grew long and stayed unnamed,
    fails here rather than as a suite cut off on a lent GPU."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import suite_order

    from tests.conftest import LONGEST_FIRST

    files = {p.stem for p in (REPO / "tests").glob("test_*.py")}
    assert set(LONGEST_FIRST) <= files, set(LONGEST_FIRST) - files
    seconds = suite_order.file_seconds([REPO / "tests" / "fixtures" / "h200-2026-11-28" / "junit.xml"])
    assert sum(seconds.values()) > 3000  # the whole run was read, mapped to today's files
    named = [f for f in LONGEST_FIRST if f in seconds]
    order = named + sorted(f for f in seconds if f not in LONGEST_FIRST)
    best = sorted(seconds, key=lambda f: -seconds[f])
    assert suite_order.simulated_end(seconds, order, 8) <= 1.05 * suite_order.simulated_end(seconds, best, 8)
