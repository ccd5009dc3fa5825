"""Inductor's check of which vector ISA the CPU has is a fact about the machine: an isolated job
takes it from the user's cache, and a check that cannot run there is redone, never trusted broken.

The suite's slowest test is here (g++ builds Inductor's check programs: 42 s on the 2-core VM,
283 s on the H100 machine of 2026-11-27 beside 7 other workers), so it has a file of its own:
pytest-xdist deals out whole files, tests/conftest.py the longest first.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _isa_in_an_isolated_job(user: Path, job: Path, ask: bool = True) -> tuple[str, int]:
    """In a fresh process with the user's Inductor cache at ``user``: enter an isolated job's
    cache scope with the CPU check on and ask for the ISA, as a compile of C++ kernels does first
    (unless not ``ask``: a cold check costs 9 s). Returns the ISA and the files in the job's folder."""
    import subprocess
    import sys

    script = f"""
import os
from pathlib import Path
from perfsweep import compile as c
os.environ["TORCHINDUCTOR_CACHE_DIR"] = {str(user)!r}
with c.cache_scope("isolated", Path({str(job)!r}), probe_cpu=True):
    import importlib.util
    if importlib.util.find_spec("torch._dynamo.package"):  # Dynamo's own cache (2.8 has no DynamoCache; 2.6 no module)
        import torch._dynamo.package as dynamo_package  # what the optimizer imports first: it must work
        cache = getattr(dynamo_package, "DynamoCache", None)
        bound = [str(v) for v in vars(cache).values() if isinstance(v, str)] if cache else [{str(job)!r}]
        assert bound and all(v.startswith({str(job)!r}) for v in bound), bound  # Dynamo's cache is the job's
    from torch._inductor import cpu_vec_isa
    isa = cpu_vec_isa.pick_vec_isa() if {ask!r} else "skipped"
    inside = [p.name for p in Path({str(job)!r}).rglob("*") if p.is_file()]
print(str(isa) or "none", len(inside))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    isa, files_inside = res.stdout.strip().splitlines()[-1].rsplit(" ", 1)  # an ISA's name has spaces
    return isa, int(files_inside)


def test_an_isolated_job_checks_the_cpu_isa_in_the_users_cache_not_its_own(tmp_path: Path):
    """Inductor's check of which vector ISA the CPU has is a fact about the machine: an isolated
    job runs it in the user's cache, so its compile finds the answer in-process and neither repeats
    the check nor times it. Measured on this project's 2-core Xeon: the tiny GPT's cold compile took
    18 s with the check, 9 s without (benchmarks/bench_cpu_compile_isa.py).

    Then the user's check programs stop loading (truncated by a killed build; any .so on a noexec
    /tmp, Inductor's default place): Inductor finds them, does not rebuild them, and fails each
    candidate without an error. First all but the weakest candidate's: the check there passes it
    alone, and the job took that ISA (AVX2 on an AVX-512 machine) for every kernel. Then all of
    them: the job took 'no vector ISA', every kernel scalar. Each time the job must find the ISA a
    fresh check finds, checked again before the compile, outside the compile's own cache.
    """
    import platform
    import subprocess
    import sys

    from torch._inductor import cpu_vec_isa

    user = tmp_path / "user"
    isa, inside = _isa_in_an_isolated_job(user, tmp_path / "job")
    assert inside == 0  # the isolated cache holds only what the job's own graphs compile
    programs = list(user.rglob("*.so"))
    if isa == "none" or not programs:
        pytest.skip("no vector ISA whose check builds a program on this machine")
    if platform.machine() in ("x86_64", "AMD64"):
        flags = cpu_vec_isa.x86_isa_checker()
        has = [i for i in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(i).split())]
        if len(has) >= 2 and isa != str(has[-1]):  # something weaker to fall to
            weakest = tmp_path / "weakest"  # its program alone, to know its file: names hash the source and flags
            build = f"from torch._inductor import cpu_vec_isa as c; assert c.{type(has[-1]).__name__}()"
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(weakest)}
            subprocess.run([sys.executable, "-c", build], env=env, check=True, timeout=300)
            keep = {p.name for p in weakest.rglob("*.so")}
            assert keep and any(so.name not in keep for so in programs)
            for so in programs:
                if so.name not in keep:
                    so.write_bytes(b"")  # still found, so not rebuilt; no longer loadable
            again, inside = _isa_in_an_isolated_job(user, tmp_path / "job2")
            assert (again, inside) == (isa, 0)
    for so in programs:
        so.write_bytes(b"")
    again, inside = _isa_in_an_isolated_job(user, tmp_path / "job3")
    assert (again, inside) == (isa, 0)


def test_candidates_that_fail_in_a_fresh_folder_too_are_the_machines_answer_and_kept(tmp_path: Path):
    """A g++ that cannot build the vector ISAs' check programs (too old for -mamx-tile, say; here a
    wrapper that refuses every -mavx*/-mamx* flag) fails them in the user's cache and in a fresh
    folder alike: that is the machine's answer. It is kept, so the compile does not check a third
    time inside compile_time_ms, and no warning blames the user's cache: every compile job of such
    a machine printed one and checked again inside its compile."""
    import platform
    import subprocess
    import sys

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the wrapper refuses x86 vector flags; Inductor checks other ISAs elsewhere")
    wrapper = tmp_path / "gxx"
    wrapper.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in -mavx*|-mamx*) exit 1;; esac; done\nexec g++ "$@"\n')
    wrapper.chmod(0o755)
    job = tmp_path / "job"
    script = f"""
import logging, os
from pathlib import Path
from perfsweep import compile as c
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = {str(tmp_path / "user")!r}
with c.cache_scope("isolated", Path({str(job)!r}), probe_cpu=True):
    from torch._inductor import cpu_vec_isa
    isa = cpu_vec_isa.pick_vec_isa()
    inside = [p.name for p in Path({str(job)!r}).rglob("*") if p.is_file()]
print(str(isa) if isa else "none", len(inside))
"""
    env = {**os.environ, "CXX": str(wrapper)}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["none", "0"]  # no vector ISA, and no check redone in the job's own cache
    assert "in a fresh folder alike" in res.stderr and "WARNING" not in res.stderr, res.stderr[-2000:]


def test_a_user_cache_that_cannot_be_a_folder_leaves_the_job_working(tmp_path: Path):
    """TORCHINDUCTOR_CACHE_DIR under a file: the check cannot run there; Inductor and Dynamo,
    imported under the job's own cache, still work, and the compile does the check as before."""
    (tmp_path / "a-file").write_text("")
    isa, inside = _isa_in_an_isolated_job(tmp_path / "a-file" / "cache", tmp_path / "job", ask=False)
    assert (isa, inside) == ("skipped", 0)
