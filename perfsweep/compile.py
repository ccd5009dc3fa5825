"""torch.compile: applying it and reading back what Dynamo did.

Compile latency and steady-state speed are reported separately: ``compile_time_ms`` is the
first step minus the steady-state median, and the sweep fills ``compile_payback_steps``
(compile time over the per-step saving against the eager twin of the same config).

Jobs are separate processes, but Inductor and Triton keep their caches on disk: a graph that
an earlier process compiled loads in seconds (3.4 s against 28.4 s cold for GPT-2 small on an
H100). By default each job therefore compiles into an empty cache of its own
(``compile_cache=isolated``), and ``compile_cache_hits`` records how many compiled graphs
were loaded from a cache instead, so a warm compile is visible in SQL.

On CPU, Inductor also keeps in that cache which vector instruction sets (AVX-512, AVX2, ...)
its C++ kernels may use, found by compiling and loading a small program per candidate. That is
a fact about the machine, not the graph: in an empty cache every job paid it again, 8 s of the
tiny GPT's 18 s cold compile on a 2-core Xeon. A CPU job therefore asks for it before its
first step, in the user's usual cache (once per machine, as any torch user pays it), so that
``compile_time_ms`` is the graph's compile alone, in either cache mode.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from perfsweep.envinfo import environ_set

log = logging.getLogger(__name__)

CACHE_ENV = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
"""Environment variables that place Inductor's (FX graph, AOTAutograd, C++/Triton code) and
Triton's kernel caches, and the folder of each in an isolated cache."""


@contextlib.contextmanager
def cache_scope(mode: str, job_dir: Path, probe_cpu: bool = False) -> Iterator[None]:
    """With ``mode='isolated'``, point the compile caches at an empty folder in ``job_dir``.

    Must be entered before the first compile of the process (the job process is fresh). The
    folder is removed afterwards: it can hold hundreds of MB of kernels nobody will reuse.
    ``probe_cpu`` (Inductor compiling C++ kernels for the CPU) first runs the machine's vector
    ISA check in the user's usual cache, in either mode, so that no ``compile_time_ms`` holds it
    (see the module docstring).
    """
    user_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if mode != "isolated":
        if probe_cpu:
            probe_cpu_isa(user_cache, job_dir)
        yield
        return
    root = job_dir / "compile_cache"
    shutil.rmtree(root, ignore_errors=True)
    try:
        with environ_set({var: str(root / folder) for var, folder in CACHE_ENV.items()}):
            if probe_cpu:
                probe_cpu_isa(user_cache, job_dir)
            yield
    finally:
        shutil.rmtree(root, ignore_errors=True)


def probe_cpu_isa(user_cache: str | None, job_dir: Path) -> None:
    """Run Inductor's check of the CPU's vector instruction sets now, in ``user_cache`` (None:
    torch's default folder), whatever cache the job's compile will use.

    Inductor keeps the answer for the rest of the process (``functools.cache``), so the compile
    neither repeats the check nor writes it to its own cache. Inductor is imported first, under
    the job's cache settings: Dynamo fixes some cache paths when it is imported.

    A candidate the CPU has (by its flags) can fail the check in the user's folder without an
    error: a program truncated by a killed build is found there and not rebuilt, and ``/tmp``,
    Inductor's default place, may be ``noexec``. Kept, that answer made every kernel of the job
    scalar, or of a weaker ISA (AVX2 on an AVX-512 machine). The check is then redone in a fresh
    folder in ``job_dir``, still before the timed compile, and removed (:func:`_check_again_fresh`).
    """
    t0 = time.perf_counter()
    try:
        from torch._inductor import cpu_vec_isa
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        where = user_cache or default_cache_dir()
        with environ_set({"TORCHINDUCTOR_CACHE_DIR": where}):
            isa = cpu_vec_isa.pick_vec_isa()
        if not isa or failed_candidates(cpu_vec_isa):
            isa = _check_again_fresh(cpu_vec_isa, job_dir, where)
            if isa is None:
                return
    except Exception as exc:  # a private API: without it the check stays inside the compile, as before
        log.info("could not check the CPU's vector ISA before the compile (%s); the compile does it", exc)
        return
    log.info("CPU vector ISA for Inductor: %s (checked in %.1f s, before the compile)", isa, time.perf_counter() - t0)


def _check_again_fresh(cpu_vec_isa: Any, job_dir: Path, where: str) -> Any:
    """The user's cache passed fewer ISAs than the CPU has by its flags: check again in a fresh
    folder and keep what passes there (it is what the compile would find in its own cache).

    The same answer means the machine cannot do the rest (a g++ too old for ``-mamx-tile``, a
    kernel without AMX, ``TORCHINDUCTOR_VEC_ISA_OK=0``): kept, and said at info level. More passing
    there means the user's programs were stale or unloadable: kept, with a warning. Less passing
    (the job's folder cannot run programs) keeps nothing: the compile checks in its own cache, as
    it would without perfsweep. Returns the ISA kept, None for nothing kept."""
    in_user = passed_candidates(cpu_vec_isa)
    failed = failed_candidates(cpu_vec_isa)
    forget_isa_check(cpu_vec_isa)
    job_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=job_dir, prefix="isa_check_") as fresh:
        with environ_set({"TORCHINDUCTOR_CACHE_DIR": fresh}):
            isa = cpu_vec_isa.pick_vec_isa()
        in_fresh = passed_candidates(cpu_vec_isa)
    why = f"{', '.join(failed)} failed" if failed else "no candidate passed"
    if in_fresh == in_user:
        log.info("Inductor's CPU vector ISA check: %s in the user's cache (%s) and in a fresh folder alike", why, where)
        return isa
    if in_fresh > in_user:
        log.warning(
            "Inductor's CPU vector ISA check: %s in the user's cache (%s), a stale or unloadable build; checked "
            "again in a fresh folder. Removing that cache's check programs (*.so) stops this",
            why,
            where,
        )
        return isa
    forget_isa_check(cpu_vec_isa)
    log.warning(
        "Inductor's CPU vector ISA check: fewer or other candidates passed in a fresh folder in %s than in the "
        "user's cache (%s); the compile checks again in its own, inside compile_time_ms",
        job_dir,
        where,
    )
    return None


def passed_candidates(cpu_vec_isa: Any) -> set[str]:
    """The ISAs whose check passed (Inductor keeps the list for the process)."""
    return {str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()}


def failed_candidates(cpu_vec_isa: Any) -> list[str]:
    """The ISAs this x86 CPU has by its flags whose check did not pass (Inductor's own rule
    for which candidates to check); [] elsewhere, where Inductor has one candidate at most."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    flags = cpu_vec_isa.x86_isa_checker()
    passed = passed_candidates(cpu_vec_isa)
    has = [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(isa).split())]
    return [isa for isa in has if isa not in passed]


def forget_isa_check(cpu_vec_isa: Any) -> None:
    """Drop what Inductor keeps of its ISA check for the rest of the process (``functools``
    caches on the list of valid ISAs and on each candidate's check), so the next compile checks
    again, in its own cache. A check whose programs did not build or load in the user's folder (a
    ``noexec`` /tmp, Inductor's default place; a truncated ``.so`` it finds and does not rebuild)
    fails without an error, and kept, it made every kernel of the job scalar."""
    cpu_vec_isa.valid_vec_isa_list.cache_clear()
    for cls in {k for isa in cpu_vec_isa.supported_vec_isa_list for k in type(isa).__mro__}:
        for attr in vars(cls).values():
            if callable(clear := getattr(attr, "cache_clear", None)):
                clear()


def apply(model: torch.nn.Module, backend: str, mode: str | None) -> torch.nn.Module:
    torch._dynamo.reset()
    return torch.compile(model, backend=backend, mode=mode)  # type: ignore[return-value]


def diagnostics() -> dict[str, Any]:
    """Graphs, graph breaks with reasons, and recompilations from Dynamo's counters."""
    from torch._dynamo.utils import counters

    breaks = {str(reason): int(n) for reason, n in counters["graph_break"].items()}
    return {
        "n_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "n_graph_breaks": int(sum(breaks.values())),
        "n_recompiles": count_recompiles(),
        "graph_break_reasons": breaks or None,
        # graphs loaded from Inductor's FX graph cache or AOTAutograd's cache instead of compiled
        "compile_cache_hits": int(counters["inductor"].get("fxgraph_cache_hit", 0))
        + int(counters["aot_autograd"].get("autograd_cache_hit", 0)),
    }


def count_recompiles() -> int:
    """Recompilations, from Dynamo's guard-failure log.

    A frame recompiles only when the guards of every cached entry fail, and its first entry
    (compile id ``N/0``) is always among them, so each recompilation leaves exactly one
    ``N/0:`` reason. Other reasons are the later entries failing in the same check.
    """
    from torch._dynamo.utils import guard_failures

    reasons = [str(r) for rs in guard_failures.values() for r in rs]
    return sum(1 for r in reasons if re.match(r"\d+/0:", r))
