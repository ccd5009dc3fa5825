"""Everything checked before the first job starts: each mistake answered in one line, exit 2.

Hydra composes and type-checks the config and ``config.py`` range-checks it; what neither can
see is checked here, for every grid point, before any job process exists: the device asked
for is on this machine, the data exists and holds at least one batch, and the database takes
a write (the sweep's row is reserved with it). Hydra's own multi-line composition errors are
turned into one line that names the key and the value. The sweeper and the single-run entry
point call the same functions, so ``-m`` and a plain run answer a mistake the same way.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import shlex
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from perfsweep.cli import first_line, hide_db_url, hide_password_in_word, waiting_for_database
from perfsweep.config import (
    ALLOWED_VALUES,
    DATA_KEY_READERS,
    GPT_TARGET,
    NODE_SCHEMAS,
    AmpDtype,
    ConfigError,
    DataKind,
    Device,
    PerfsweepConfig,
    Timing,
    config_keys,
    config_types,
    to_plain_dict,
)
from perfsweep.names import (
    MULTI_HOST_LAUNCHERS,
    NETWORK_FILESYSTEMS,
    OLDEST_TORCH,
    SEARCH_ANSWERED,
    SWEEP_MARKER,
    is_multirun,
)

COMPOSE_ERRORS: tuple[type[BaseException], ...] = (ConfigError, HydraException, OmegaConfBaseException)
"""What composing and validating a grid point can raise for bad input (anything else is a bug)."""

NO_JOB = "no job was started"


LAUNCHER_EXTRAS: dict[str, str] = {
    "joblib": "joblib",
    "submitit_local": "slurm",
    "submitit_slurm": "slurm",
    "perfsweep_slurm": "slurm",
}
"""Hydra launcher presets that come with a plugin package, and the perfsweep extra that installs it."""


def _launcher_hint(name: str) -> str:
    extra = LAUNCHER_EXTRAS.get(name)
    return f"; its plugin is not installed: pip install 'perfsweep[{extra}]'" if extra else ""


EXPERIMENT_DIRS: tuple[str, ...] = ("experiments", "examples")
"""Where perfsweep's checkout keeps configs to pass with ``-cd``: a ``-cn`` not found elsewhere is
looked for here, so the one line can say which ``-cd`` was missing."""


def _search_path(message: str) -> tuple[list[Path], set[str], str]:
    """The folders of Hydra's config search path its message printed, the config names on it, and
    the path in words ("/x/experiments or perfsweep's own configs")."""
    # one entry a line, to its end: a -cd folder may have spaces in its name
    searched = [Path(d.strip()) for d in re.findall(r"path=file://(.+)", message)]
    packages = [m.strip() for m in re.findall(r"path=pkg://(.+)", message) if m.strip() != "hydra.conf"]
    choices = {p.stem for d in searched for p in d.glob("*.yaml")}
    for package in packages:
        with contextlib.suppress(ModuleNotFoundError, FileNotFoundError, TypeError):
            choices |= {Path(str(p)).stem for p in resources.files(package).iterdir() if p.name.endswith(".yaml")}
    return searched, choices, " or ".join([*(str(d) for d in searched), "perfsweep's own configs"])


def _missing_default(name: str, message: str) -> str:
    """A config's defaults list names ``name``, which is on no folder of the search path (the
    config itself was found: ``-cn`` is not to blame)."""
    _, choices, where = _search_path(message)
    close = difflib.get_close_matches(name, sorted(choices), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    parent = re.match(r"In '([^']+)'", message)
    return (
        f"{parent.group(1) if parent else 'a config'}: its defaults list names {name}: no config {name}.yaml in "
        f"{where}; {hint}choices: {', '.join(sorted(choices))}"
    )


def _missing_primary_config(name: str, message: str) -> str:
    """``-cn NAME`` names no config on Hydra's search path: the closest name there, every choice,
    or the ``-cd`` folder of the launch directory that has it (Hydra printed the search path)."""
    searched, choices, where = _search_path(message)
    here = {folder: sorted(p.stem for p in (Path.cwd() / folder).glob("*.yaml")) for folder in EXPERIMENT_DIRS}
    for folder, names in here.items():
        if name in names:  # -cd missing, or naming another folder
            return f"-cn {name}: not found in {where}; it is in ./{folder}: {'use' if searched else 'add'} -cd {folder}"
    close = difflib.get_close_matches(name, sorted(choices), n=1)
    hint = f"did you mean -cn {close[0]}? " if close else ""
    for folder, names in here.items():
        if not close and (near := difflib.get_close_matches(name, names, n=1)):  # a typo, and -cd missing too
            hint = f"did you mean -cd {folder} -cn {near[0]}? "
    return f"-cn {name}: no config {name}.yaml in {where}; {hint}choices: {', '.join(sorted(choices))}"


def presets_with(key: str) -> list[str]:
    """perfsweep's own ``model`` or ``data`` presets whose YAML sets ``key`` (``data.path``:
    ``["textfile"]``): the schema declares every key of every preset, a preset only its own."""
    group, _, leaf = key.partition(".")
    if group not in NODE_SCHEMAS or not leaf or "." in leaf:
        return []
    from omegaconf import OmegaConf

    folder = resources.files("perfsweep.conf") / group
    found = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml") and leaf in (OmegaConf.create(entry.read_text()) or {}):
            found.append(entry.name.removesuffix(".yaml"))
    return found


def _key_of_other_presets(key: str, as_typed: str, owners: list[str]) -> str:
    """A key perfsweep knows, set on a preset that lacks it (``data.path=x`` with the default
    data=stdlib): which presets have it (``owners``); for a model key, how model=custom's factory
    takes it."""
    group, _, leaf = key.partition(".")
    as_typed = as_typed.lstrip("+")
    if not owners:  # declared, but no preset sets it: added, it is read
        return f"{as_typed}: the {group} preset in use does not set {leaf}; add it: +{as_typed}"
    if len(owners) == 1:
        have = f"{group}={owners[0]} has it: add {group}={owners[0]}"
    else:
        have = f"{group}={', '.join(owners[:-1])} and {owners[-1]} have it"
    custom = f"; a model=custom factory takes it as +{as_typed}" if group == "model" and "custom" not in owners else ""
    return f"{as_typed}: the {group} preset in use has no key {leaf}; {have}{custom}"


def data_keys_read(points: list[tuple[list[str], PerfsweepConfig]]) -> list[str]:
    """Each kind-specific ``data.<key>`` the command line sets (``points``: a grid point's
    overrides and config), against the data kinds of the grid points (config.DATA_KEY_READERS).

    Refused when no grid point's kind reads it: ``+data.path`` on data=stdlib trained on the
    stdlib without a word. Where only some do (data=synthetic,textfile ++data.path=...), the
    others run without it, and the returned notes say so."""
    seen: dict[str, tuple[Any, frozenset[DataKind], set[DataKind], bool]] = {}
    for overrides, cfg in points:
        if cfg.data.kind == DataKind.custom:  # a factory's keys are its own
            continue
        for override in overrides:
            key = override.split("=", 1)[0].lstrip("+")
            group, _, leaf = key.partition(".")
            if override.startswith("~") or group != "data" or (readers := DATA_KEY_READERS.get(leaf)) is None:
                continue
            value, _, ignoring, read = seen.get(key, (getattr(cfg.data, leaf), readers, set(), False))
            if cfg.data.kind in readers:
                read = True
            else:
                ignoring.add(cfg.data.kind)
            seen[key] = (value, readers, ignoring, read)
    notes = []
    for key, (value, readers, ignoring, read) in seen.items():
        if not ignoring:
            continue
        kinds = " or ".join(sorted(k.value for k in readers))
        only = f"only data.kind={kinds} read{'s' if len(readers) == 1 else ''} it"
        other = ", ".join(sorted(k.value for k in ignoring))
        if not read:
            add = " or ".join(f"data={k.value}" for k in sorted(readers, key=lambda k: k.value))
            raise ConfigError(
                f"invalid config: {key}={value!r}: {only}, and the data in use is data.kind={other}; "
                f"use {add}, or leave {key} out"
            )
        notes.append(f"perfsweep: {key}={value!r}: {only}; the grid points with data.kind={other} run without it")
    return notes


def override_problem(overrides: list[str]) -> str | None:
    """What in the command line's overrides Hydra would run as something other than what was typed,
    in one line (None when nothing): it takes the last of two overrides of one key, which drops a
    grid given as one of them (``-m batch=8,16 batch=4`` ran one job, batch=4, and said nothing of
    the grid; two single values, ``steps.measure=3 ... steps.measure=100``, are the usual "the last
    one wins" of a command line, and stay so); it reads ``yes``,
    ``on`` and any number as true for a true/false key (``-m compile=1,2`` ran the same config
    twice, each a cold compile); and ``amp=true, false`` (a space after the comma) got a page of
    its grammar that named neither the override nor the cause."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except HydraException:  # Hydra says what is wrong with the text itself as it composes, but not this
        for text, after in zip(overrides, [*overrides[1:], "..."], strict=True):
            if text.endswith(",") and _unparsable(parser, text):
                return (
                    f"{text!r} ends in a comma: a space after it made the rest another argument; write the "
                    f"values without spaces ({text}{after}) or quote them"
                )
        return None
    seen: dict[tuple[str, str | None], Any] = {}
    types = config_types()
    for o in parsed:
        key = (o.key_or_group, o.package)
        if (first := seen.get(key)) is not None and (first.is_sweep_override() or o.is_sweep_override()):
            values = ",".join(
                dict.fromkeys(v for line in (first.input_line, o.input_line) for v in line.partition("=")[2].split(","))
            )
            return (
                f"{o.key_or_group} is given twice ({first.input_line} and {o.input_line}), and Hydra keeps the last "
                f"alone; give each key once, its values as one list ({o.key_or_group}={values})"
            )
        seen[key] = o
        declared = types.get(o.key_or_group, "")
        # model.* and data.* are typed after composition, by the preset's own schema (a factory's
        # `bias` may be a number), and refuse a value of another type there (config._check_types)
        if (
            declared.removesuffix(" | None") != "bool"
            or o.is_delete()
            or o.key_or_group.partition(".")[0] in NODE_SCHEMAS
        ):
            continue
        try:
            values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        except Exception:  # noqa: BLE001 - a sweep form Hydra itself refuses later, in its own words
            continue
        optional = declared.endswith(" | None")
        if loose := [v for v in values if not _plain_bool(v, optional)]:
            typed = o.input_line.partition("=")[2]
            shown = typed if not o.is_sweep_override() else "null" if loose[0] is None else loose[0]
            listed = re.fullmatch(r"\[(.*)\]", typed) if isinstance(loose[0], list) else None
            sweep = f" (one job per value is a sweep: -m {o.key_or_group}={listed.group(1)})" if listed else ""
            return f"{o.key_or_group}={shown}: must be {ALLOWED_VALUES['bool']}{' or null' if optional else ''}{sweep}"
    return None


def _plain_bool(value: Any, optional: bool) -> bool:
    """Whether Hydra reads ``value`` (an override's, or one of its sweep's) as what it says for a
    true/false key: true, false, 'true' in quotes, null where the key takes it, or an
    interpolation (``${oc.env:USE_AMP,false}``), resolved and checked when the config is."""
    text = getattr(value, "text", value)  # a quoted value of a sweep: QuotedString
    if isinstance(text, bool) or (text is None and optional):
        return True
    return isinstance(text, str) and ("${" in text or text.strip().lower() in ("true", "false"))


def _unparsable(parser: Any, text: str) -> bool:
    try:
        parser.parse_overrides([text])
    except HydraException:
        return True
    return False


def error_line(exc: BaseException) -> str:
    """One line for a composition or validation error: key, value and what is allowed.

    Hydra puts the reason in the exception's cause and the key on later lines, and answers an
    unknown preset with the whole config search path; a person needs the name they mistyped and
    the closest one that exists.
    """
    if isinstance(exc, OverrideParseException):
        return _unreadable_override(exc)
    if (ambiguous := re.match(r"Ambiguous value for argument '(.*?)'", str(exc))) is not None:
        # a plain run given a grid: Hydra's three numbered options, the sweep last, ran together
        key, _, value = ambiguous.group(1).partition("=")
        return (
            f"{key}={value}: several values are a sweep, one job each: add -m; a value that is itself a "
            f"list is {key}=[{value}], and a string holding a comma {key}='{value}'"
        )
    if isinstance(exc, MissingConfigException) and exc.options is None and exc.missing_cfg_file:
        if str(exc).startswith("Cannot find primary config"):  # -cn NAME itself
            return _missing_primary_config(str(exc.missing_cfg_file), str(exc))
        return _missing_default(str(exc.missing_cfg_file), str(exc))  # "In 'NAME': Could not load 'OTHER'"
    if isinstance(exc, MissingConfigException) and exc.options is not None and exc.missing_cfg_file:
        group, _, name = str(exc.missing_cfg_file).rpartition("/")
        choices = sorted(exc.options)
        close = difflib.get_close_matches(name, choices, n=1)
        hint = f"did you mean {group}={close[0]}? " if close else ""
        key = group or "config name (-cn)"
        if group == "hydra/launcher" and name in LAUNCHER_EXTRAS and name not in choices:
            return f"{key}={name}: no such preset{_launcher_hint(name)}"
        return f"{key}={name}: no such preset; {hint}choices: {', '.join(choices)}"
    # perfsweep_slurm builds on submitit's preset, which its plugin brings
    if (plugin := re.search(r"In 'hydra/launcher/(\w+)': Could not load 'hydra/launcher/(\w+)'", str(exc))) is not None:
        return (
            f"hydra/launcher={plugin.group(1)}: needs hydra/launcher/{plugin.group(2)}{_launcher_hint(plugin.group(2))}"
        )
    unknown = re.search(r"Key '([\w.]+)' (?:not in|is not in) (?:'\w+'|struct)", f"{exc} {exc.__cause__}")
    override = re.search(r"override '([\w.]+)'", str(exc))
    typed = re.search(r"use \+(\S+)", str(exc))  # Hydra's own advice quotes key=value as typed
    if unknown is not None:
        key = override.group(1) if override else unknown.group(1)
        as_typed = typed.group(1) if typed else key
        if key in config_keys() and key.partition(".")[0] in NODE_SCHEMAS:
            return _key_of_other_presets(key, as_typed, presets_with(key))
        close = difflib.get_close_matches(key, config_keys(), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return f"{as_typed}: no such key; {hint}python -m perfsweep --help lists them"
    # a group of settings given one value (steps=5): OmegaConf named the schema class, not the keys
    group = re.search(
        r"override ([\w.]+)=(.*?)\W+Invalid type assigned: \w+ is not a subclass", f"{exc} {exc.__cause__}"
    )
    if group is not None and group.group(1) == "sweep":
        return f"sweep={group.group(2)}: sweep.* is perfsweep's own bookkeeping for each job, not a setting"
    if group is not None and (keys := sorted(k for k in config_keys() if k.startswith(f"{group.group(1)}."))):
        shown = ", ".join(keys[:6]) + (", ..." if len(keys) > 6 else "")
        return f"{group.group(1)}={group.group(2)}: {group.group(1)} is a group of settings; set one of them: {shown}"
    # \s+, not \W+: amp=[true,false] was echoed as amp=[true,false
    wrong_type = r"override ([\w.]+)=(.*?)\s+Value '.*' (?:is not a valid (bool)|.* converted to (Integer|Float))"
    if (bad := re.search(wrong_type, f"{exc} {exc.__cause__}")) is not None:  # one line: key, value, allowed
        kind = bad.group(3) or bad.group(4)
        allowed = ALLOWED_VALUES[{"bool": "bool", "Integer": "int", "Float": "float"}[kind]]
        key, value = bad.group(1), bad.group(2)
        listed = re.fullmatch(r"\[(.*)\]", value)  # a list where a sweep was meant
        sweep = f" (one job per value is a sweep: -m {key}={listed.group(1).replace(' ', '')})" if listed else ""
        return f"{key}={value}: must be {allowed}{sweep}"
    parts = [str(exc)]
    if exc.__cause__ is not None:
        parts.append(str(exc.__cause__))
    lines = [ln.strip() for p in parts for ln in p.splitlines() if ln.strip()]
    lines = [
        ln for ln in lines if not ln.startswith(("object_type=", "full_key:", "reference_type=", "Set the environment"))
    ]
    return ": ".join(dict.fromkeys(lines)) or type(exc).__name__


QUOTE_WORTHY = re.compile(r"[=,\s\[\](){}'\"\\$]")
"""Characters that Hydra's override grammar reads as syntax in an unquoted value (a ``:`` in a
URL or path it takes as it is)."""


def _unreadable_override(exc: OverrideParseException) -> str:
    """An override Hydra's grammar cannot read, named with its key and value: Hydra's own line
    named neither where the parser failed on a character (``hydra.sweep.dir=/runs/a=b`` got
    "mismatched input '=' expecting <EOF>"), and linked its grammar page on the next line. A
    value holding syntax is shown quoted, the usual fix (a job folder's name holds ``=`` and
    ``,``)."""
    override = str(exc.override)
    key, eq, value = override.partition("=")
    raw = str(exc.message).splitlines()
    lines = [ln.strip() for ln in raw if ln.strip() and not ln.strip().startswith(("See ", "^"))]
    lexer = "LexerNoViableAltException: "
    if lines and lines[0].startswith(lexer):  # no token starts at the caret Hydra draws below it
        caret = next((ln.index("^") - len(lexer) for ln in raw if ln.strip() == "^"), -1)
        rest = override[caret:] if caret >= 0 else ""
        why = "an unclosed quote" if rest[:1] in ("'", '"') else f"unexpected {rest[:12]!r}" if rest else "unreadable"
    else:
        why = re.sub(r"^Error parsing override '.*?'", "", lines[0] if lines else "").strip(": ")
        why = why or (lines[1] if len(lines) > 1 else "unreadable")
    quoted = ""
    if eq and re.search(r"[/=]", value) and QUOTE_WORTHY.search(value) and value[:1] not in ("'", '"'):
        quoted = f"; quote a path or URL that holds = , spaces or brackets: {key}='{value}'"
    return (
        f"{override}: cannot be read as an override ({why}){quoted} "
        "(https://hydra.cc/docs/advanced/override_grammar/basic/)"
    )


def check_device(cfgs: list[PerfsweepConfig]) -> None:
    """A CUDA-only setting on a machine where torch sees no GPU is refused here, not in job 1.
    Torch is asked only where such a setting is asked for (on a CUDA build the question imports
    it in this process, seconds: :func:`check_all`)."""
    from perfsweep import slots

    wanted = next((needs for c in cfgs if (needs := _cuda_only(c))), None)
    if wanted is None or slots.cuda_available():
        return
    why = f"torch {slots.torch_version()} sees no CUDA device on this machine"
    raise ConfigError(f"invalid config: {wanted.format(why=why)}")


def _cuda_only(cfg: PerfsweepConfig) -> str | None:
    """The setting of ``cfg`` that needs CUDA, as its refusal says it (``{why}``: that torch sees
    no GPU here), or None: asking this needs no torch."""
    if cfg.device == Device.cuda:
        return "device='cuda': {why}; use device=cpu or device=auto"
    if cfg.amp and cfg.amp_dtype == AmpDtype.fp16:
        return "amp_dtype='fp16': fp16 autocast needs CUDA and {why}; use amp_dtype=bf16"
    if cfg.timing == Timing.events:
        return "timing='events': CUDA events need a GPU and {why}; use timing=sync or auto"
    return None


def cpu_sweep_fields(cfgs: list[PerfsweepConfig], job_cpus: int | None = None) -> dict[str, float]:
    """The machine's measured matmul peaks (perfsweep.cpu_peak) when any grid point runs on the
    CPU, with the first such grid point's thread count (runs with another count get no
    utilisation: the peak depends on it; ``job_cpus``: the cores of a launcher slot, which its jobs
    use when ``threads`` is null), in the compute dtypes the CPU grid points use (fp32;
    bf16 under AMP); nothing for an all-GPU sweep."""
    from perfsweep import cpu_peak, job_start, slots

    on_cpu = [c for c in cfgs if not slots.wants_cuda(c.device)]
    if not on_cpu:
        return {}
    dtypes = {"fp32"} | ({"bf16"} if any(c.amp for c in on_cpu) else set())  # fp32 too: cpu_notice compares
    # jobs given a share of the cores (launcher.parallel, a cgroup's CPU quota) run that many
    # threads: measure with as many; in a process forked from the job server, where the jobs will
    # be (it has imported torch; job_start.call)
    return job_start.call(cpu_peak.sweep_fields, on_cpu[0].threads or job_cpus or slots.default_threads(), dtypes)


def cpu_notice(fields: dict[str, float], units: list[str] | None) -> str | None:
    """What people should know before a CPU sweep's jobs start: a CPU without bf16 units emulates
    bf16, so its AMP jobs run slower than fp32. Said when the measured bf16 matmul rate (of
    :func:`cpu_sweep_fields`) is under half the fp32 one: with bf16 units it is about twice the
    fp32 rate, emulated it was 0.12x on an AVX2-only VM. Whether it is emulated is read from the
    CPU's flags (``units``: :func:`perfsweep.envinfo.cpu_bf16_units`, None where unknown), not guessed from the rates:
    on a busy machine with AVX-512 BF16 the rate was measured at 0.38x, and the notice had called
    bf16 emulated there."""
    fp32, bf16 = fields.get("cpu_matmul_fp32_flops"), fields.get("cpu_matmul_bf16_flops")
    if not (fp32 and bf16 and bf16 < 0.5 * fp32):
        return None
    rates = f"on this CPU bf16 matmuls run at {bf16 / 1e9:,.0f} GFLOP/s, {bf16 / fp32:.2f}x the fp32 rate ({fp32 / 1e9:,.0f})"
    if units:
        return (
            f"perfsweep: {rates}, though it has bf16 units ({', '.join(units)}): other work on this machine may "
            "have slowed the measurement, and would slow the jobs' timings too"
        )
    why = "no bf16 units among its flags" if units == [] else "it seems to have no bf16 units"
    return f"perfsweep: {rates}: bf16 is emulated here ({why}), so the amp=true jobs will be slower than amp=false"


def start_notices(cpu_fields: dict[str, float], cfgs: list[PerfsweepConfig], found: list[Any]) -> list[str]:
    """What a sweep or a plain run says before its jobs start, once its row is written:
    :func:`cpu_notice`, :func:`thread_notice` (``found``: :func:`check_all`'s placements; none
    where the jobs run on other hosts) and :func:`torch_notice`, where they have something to say."""
    threads = thread_notice(cfgs, found) if found else None
    from perfsweep import envinfo

    cpu = cpu_notice(cpu_fields, envinfo.cpu_bf16_units()) if cpu_fields else None
    return [n for n in (cpu, threads, torch_notice()) if n]


def thread_notice(cfgs: list[PerfsweepConfig], found: list[Any]) -> str | None:
    """More torch threads than the cores a job may use, where :func:`placements` lets it through
    (one job at a time, one rank; beside other jobs or ranks it is refused there). Allowed, as a
    user may mean to measure it, but said: each core then runs several spinning OpenMP threads,
    and the step times measure that contention rather than the settings."""
    from perfsweep import slots

    threads = max((c.threads or 0) for c in cfgs)
    cpus = found[0].cpus or slots.allowed_cpus()
    allotted = slots.cpu_share(cpus)["cpus_allotted"]  # as the job stores it: SLURM_CPUS_PER_TASK too
    cores = allotted if isinstance(allotted, int) else len(cpus)
    if threads <= cores:
        return None
    return (
        f"perfsweep: threads={threads} is more than the {cores} CPU core(s) a job may use here: its torch "
        f"threads will share cores, and its step times measure that contention; threads<={cores} or null avoids it"
    )


def torch_notice(version: str | None = None) -> str | None:
    """A warning where the installed torch (``version``; default: its ``torch/version.py``, read
    without importing torch) is older than :data:`perfsweep.names.OLDEST_TORCH`. pip keeps
    pyproject's bound, but a conda environment or a ``--no-deps`` install need not, and there
    the figures can be wrong without any error (see OLDEST_TORCH). None where it is not older."""
    if version is None:
        from perfsweep import slots

        version = slots.torch_version()  # as runs.torch_version stores it: "2.4.1+cu121"
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found[1]), int(found[2])) >= OLDEST_TORCH:
        return None
    oldest = ".".join(map(str, OLDEST_TORCH))
    return (
        f"perfsweep: torch {version} is older than {oldest}, the oldest release perfsweep is tested on: "
        f"its jobs may fail, or store wrong compile counters (docs/benchmarks.md); install torch>={oldest}"
    )


def check_text_files(cfgs: list[PerfsweepConfig]) -> None:
    """Every ``data=textfile`` grid point's text exists and is not empty: the cheapest of the
    data's checks (a file listing), before any question to torch and any tokenizing."""
    from perfsweep import corpus

    for cfg in cfgs:
        d = cfg.data
        if d._target_ is None and d.kind == DataKind.textfile:
            try:
                files = corpus.text_files(d.path or "", d.glob)
            except FileNotFoundError as exc:
                raise ConfigError(f"invalid config: {exc}; point data.path at a UTF-8 text file or folder") from None
            if sum(f.stat().st_size for f in files) == 0:
                raise ConfigError(
                    f"invalid config: {_data_key(cfg)}: the text is empty (0 bytes); use a file with text in it"
                )


def check_data(cfgs: list[PerfsweepConfig]) -> dict[str, Any]:
    """Every grid point's data holds one batch (its text exists: :func:`check_text_files`);
    returns the prepared token data by :func:`_prepared_key` (None for a ``data._target_`` factory).

    The corpus is tokenized here (once; jobs then hit the cache), so the count is exact. A data
    factory is called here and must give one batch (:func:`check_models` then trains on it).
    """
    from perfsweep import corpus

    prepared: dict[str, Any] = {}
    for cfg in cfgs:
        d = cfg.data
        where = _data_key(cfg)
        if d._target_ is not None:
            prepared.setdefault(_prepared_key(cfg), None)
            continue
        key = _prepared_key(cfg)
        if key not in prepared:
            try:
                prepared[key] = corpus.prepare(d, cfg.seed)
            except ConfigError:
                raise  # names its own key (data.encoding, the token cache's setting)
            except OSError as exc:
                setting, cache = corpus.cache_setting(d)
                if exc.filename and Path(exc.filename).is_relative_to(cache):  # writing the cache, not reading text
                    raise corpus.cache_error(setting, exc) from None
                raise ConfigError(f"invalid config: {where}: {first_line(exc)}") from None
            except (ValueError, RuntimeError) as exc:
                raise ConfigError(f"invalid config: {where}: {first_line(exc)}") from None
        n_tokens = prepared[key].n_tokens
        needed = cfg.batch * cfg.seq_len + 1
        if (n_tokens - 1) // cfg.seq_len < cfg.batch:
            raise ConfigError(
                f"invalid config: {where}: holds {n_tokens:,} tokens, fewer than one batch "
                f"(batch={cfg.batch} windows of seq_len={cfg.seq_len} need {needed:,}); "
                "use more text or lower batch or seq_len"
            )
    return prepared


def _prepared_key(cfg: PerfsweepConfig) -> str:
    return json.dumps([to_plain_dict(cfg)["data"], cfg.seed], sort_keys=True)


def check_models(cfgs: list[PerfsweepConfig], prepared: dict[str, Any]) -> None:
    """Every distinct model but our GPT trains one step on its first batch, on the meta device (no memory, no
    kernels; or one CPU step on one sample: perfsweep.task.check): a factory that cannot be imported, returns no module, has
    nothing for ``ckpt=true`` to wrap or whose forward gives no loss is refused here in one line."""
    from perfsweep import data as data_mod
    from perfsweep import task

    seen: set[str] = set()
    for cfg in cfgs:
        if cfg.model._target_ == GPT_TARGET:  # our own model: only what ckpt=true would wrap can be wrong
            if cfg.ckpt:
                _check_gpt_ckpt_modules(cfg.model.ckpt_modules)
            continue
        plain = to_plain_dict(cfg)
        key = json.dumps([plain["model"], plain["data"], cfg.ckpt, cfg.seed, cfg.batch, cfg.seq_len], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        token_data = prepared.get(_prepared_key(cfg))
        where = f"invalid config: {_data_key(cfg)}"
        try:
            loader = data_mod.loader(cfg.data, token_data, cfg.batch, cfg.seq_len, 0, cfg.seed, pin_memory=False)
            batch = next(iter(loader))
            tokens, samples = task.units(batch, cfg.model.unit)
        except StopIteration:
            raise ConfigError(f"{where}: yields no batch of batch={cfg.batch}") from None
        except task.ContractError as exc:
            raise ConfigError(str(exc) if str(exc).startswith("invalid config") else f"{where}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's dataset: what it raises is the answer
            raise ConfigError(
                f"{where}: reading the first batch raised {type(exc).__name__}: {first_line(exc)}"
            ) from None
        _check_batch_shape(cfg, where, tokens, samples)
        vocab = token_data.vocab_size if token_data is not None else None
        task.check(cfg.model, batch, vocab, cfg.seq_len, ckpt=cfg.ckpt)


def check_compile_backends(backends: list[str]) -> None:
    """Each ``compile_backend`` a ``compile=true`` grid point names is one torch.compile knows here
    (its registry, entry points included): a mistyped one failed every such job at its compile."""
    from torch._dynamo import list_backends
    from torch._dynamo.backends.registry import lookup_backend

    for name in backends:
        try:
            lookup_backend(name)
        except Exception:  # noqa: BLE001 - InvalidBackend, or a backend whose own import fails
            known = ", ".join(sorted({*list_backends(), "eager", "aot_eager"}))  # not its debug ones
            raise ConfigError(
                f"invalid config: compile_backend={name!r}: not a torch.compile backend here; allowed: {known} "
                "(some need a package of their own)"
            ) from None


def _check_batch_shape(cfg: PerfsweepConfig, where: str, tokens: int | None, samples: int) -> None:
    """A batch holds ``batch`` samples of ``seq_len`` tokens, or the stored batch, seq_len and every
    figure per token would describe a run that did not happen (a loader with its own batch size,
    data that ignores seq_len)."""
    if samples != cfg.batch:
        raise ConfigError(
            f"{where}: a batch holds {samples} samples but batch={cfg.batch}; let the factory take a `batch` "
            f"argument (or return a Dataset, which perfsweep batches), or set batch={samples}"
        )
    if tokens is not None and cfg.seq_len is not None and tokens != samples * cfg.seq_len:
        per = tokens // samples
        raise ConfigError(
            f"{where}: a batch holds sequences of {per} positions but seq_len={cfg.seq_len}; let the factory "
            f"take a `seq_len` argument, or set seq_len={per}"
        )


def _check_gpt_ckpt_modules(names: list[str]) -> None:
    """The GPT's submodule classes (the root excluded, as apply_checkpointing excludes it), from a
    one-block GPT of width 8 on the CPU: a meta-device build of the real one costs ~1.5 s once (its
    weight init imports torch._dynamo), a second and a half on every sweep for a model we wrote."""
    from perfsweep.config import GPTConfig
    from perfsweep.model import GPT

    tiny = GPT(GPTConfig(n_layers=1, n_heads=1, d_model=8, d_ff=8, max_seq_len=8), 8)
    classes = {
        n
        for m in tiny.modules()
        if m is not tiny
        for n in (type(m).__name__, f"{type(m).__module__}.{type(m).__qualname__}")
    }
    if not set(names) & classes:
        raise ConfigError(
            f"invalid config: model.ckpt_modules={sorted(names)}: ckpt=true with perfsweep's GPT: no submodule "
            "has such a class, so nothing would be checkpointed; use [Block]"
        )


def _data_key(cfg: PerfsweepConfig) -> str:
    d = cfg.data
    if d._target_ is not None:
        return f"data._target_={d._target_!r}"
    if d.kind == DataKind.textfile:
        return f"data.path={d.path!r}"
    if d.kind == DataKind.synthetic:
        return f"data.synthetic_tokens={d.synthetic_tokens}"
    return f"data={d.name}"


def check_db_url(url: str) -> None:
    """What the database's URL says alone, with no file or server touched: an in-memory SQLite
    database, a string that is no URL, a dialect SQLAlchemy does not have, a driver that is not
    installed (imported here, as opening the database would import it), a password with a bare
    '@' (SQLAlchemy reads the rest as the host, and its error showed it). Asked before the device
    and the placements, which import torch on a CUDA build: on an H200 machine these refusals took
    7.2 to 7.9 s where a refusal before torch took 3.6 s (docs/benchmarks.md, "GPU: NVIDIA H200,
    measured 2026-11-28"). What needs the database itself (a read-only file, a damaged one, a server that is
    down) is :func:`reserve_sweep`'s."""
    from sqlalchemy.engine import make_url

    from perfsweep import store

    if store.in_memory(url):
        raise ConfigError(
            f"invalid config: db.url={hide_db_url(url)!r}: an in-memory SQLite database dies with each job's "
            "process; give a file, e.g. db.url=sqlite:///results.db"
        )
    if _bare_at_in_password(url):
        raise ConfigError(
            f"cannot open db.url={hide_db_url(url)!r}: it holds '@' more than once before its query; an '@' in a user "
            "name or password is written %40 (a ':' %3A, a '/' %2F)"
        )
    try:
        dialect = make_url(store.installed_driver(url)).get_dialect()  # no connection
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's parse and plugin errors; the first line says what
        raise ConfigError(f"cannot open db.url={hide_db_url(url)!r}: {first_line(exc)}{_db_hint(url, exc)}") from None
    try:
        dialect.import_dbapi()
    except ModuleNotFoundError as exc:
        raise ConfigError(_driver_missing(url, exc)) from None


def _bare_at_in_password(url: str) -> bool:
    """Whether ``url``'s password holds an '@' not written %40: SQLAlchemy takes the first '@' for
    the password's end and the rest for the host, and its error echoed part of the password. The
    user name may hold one (``user@server:pw@host``, as Azure's PostgreSQL named users), as
    SQLAlchemy reads it; a SQLite path has no user, and its '@'s are the path's."""
    if url.startswith("sqlite") or "://" not in url:
        return False
    userinfo = url.split("?")[0].split("://", 1)[1].rpartition("@")[0]
    return "@" in userinfo.partition(":")[2]


def _driver_missing(url: str, exc: ModuleNotFoundError) -> str:
    example = "postgresql+psycopg2://..." if url.startswith("postgresql") else "sqlite:///results.db"
    return (
        f"cannot open db.url={hide_db_url(url)!r}: its driver is not installed ({exc}); install it, or name "
        f"an installed one in the URL (SQLite and PostgreSQL are tested: e.g. {example})"
    )


def _db_hint(url: str, exc: Exception) -> str:
    """What to do about ``exc`` from opening ``url``, as '; ...' (or nothing)."""
    from perfsweep import store

    if not re.match(r"[A-Za-z][\w+.-]*:", url):  # a path, as --db takes: the config wants a URL
        return f"; a SQLite file is given as a URL: db.url={store.sqlite_url(os.path.abspath(url))}"
    return store.write_hint(url, exc)


def reserve_sweep(
    url: str,
    sweep_dir: str,
    name: str,
    claim: Claim,
    measure: Callable[[], dict[str, Any]] = dict,
    **fields: Any,
) -> tuple[int, dict[str, Any]]:
    """Open ``url``, upgrade its schema, then write the sweep's row as ``running`` with ``fields``
    and what ``measure()`` returns (the CPU's matmul peak: :func:`cpu_sweep_fields`); its id and
    those measured fields. The peak is timed once the database has opened, so a wrong URL or a
    damaged file is refused without the job server started for it (3 CPU-seconds on a 2-core VM).
    The folder's ``claim`` is kept from the write on; anything that ends this before it (a
    refusal, a Ctrl-C, a SIGTERM) hands the folder back as it was.

    A wrong URL, a server that is down, a read-only file or folder: each fails here with the
    driver's first line, before any job could measure something it then cannot store. (What the
    URL says alone, :func:`check_db_url`, its callers ask before torch.)
    """
    try:
        return _reserve_sweep(url, sweep_dir, name, claim, measure, fields)
    except BaseException:
        claim.release()  # a no-op once the write has begun (Claim.keep)
        raise


def _reserve_sweep(
    url: str, sweep_dir: str, name: str, claim: Claim, measure: Callable[[], dict[str, Any]], fields: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    from perfsweep import store

    folder = path.absolute().parent if (path := store.sqlite_file(url)) is not None else None
    new_folder = folder is not None and not folder.exists()
    with waiting_for_database(url):
        try:
            engine = store.connect(url, check=True)
        except store.DamagedDatabase as exc:
            raise ConfigError(f"cannot use db.url={hide_db_url(url)!r}: {exc}") from None
        except ModuleNotFoundError as exc:  # one the driver imports as it connects
            raise ConfigError(_driver_missing(url, exc)) from None
        except Exception as exc:  # noqa: BLE001 - any driver error; its first line says what
            raise ConfigError(
                f"cannot open db.url={hide_db_url(url)!r}: {first_line(exc)}{_db_hint(url, exc)}"
            ) from None
    try:
        try:
            with waiting_for_database(url):
                earlier = store.sweep_of(engine, sweep_dir) if claim.owned else None
        except Exception as exc:  # noqa: BLE001 - any driver error; its first line says what
            raise ConfigError(
                f"cannot read db.url={hide_db_url(url)!r}: {first_line(exc)}{_db_hint(url, exc)}"
            ) from None
        if earlier is not None:
            # a new sweep into a folder the database has a sweep for (its folder emptied, removed,
            # or its marker taken over): reusing that row appended this grid's runs to the other
            # sweep. A sweep's folder is marked its own again, for its resume; a single run's,
            # which no resume reruns, is handed back
            earlier_id, multirun = earlier[0], is_multirun(earlier[1])
            resumable = multirun and claim.key == "hydra.sweep.dir"
            if resumable:
                claim.keep()
                claim.stamp(earlier_id)
            db = shlex.quote(hide_db_url(url))
            then = f"continue it with: perfsweep resume {earlier_id} --db {db}, or " if resumable else ""
            this = "sweep" if claim.key == "hydra.sweep.dir" else "run"
            raise ConfigError(
                f"{claim.key}={sweep_dir}: db.url={hide_db_url(url)!r} holds {'sweep' if multirun else 'run'} "
                f"{earlier_id} of this folder already, though none of its jobs is in the folder now; {then}give this "
                f"{this} another {claim.key}"
            )
        if claim.took_over is not None:  # said once no row holds the folder: it is this sweep's now
            print(
                f"perfsweep: {claim.key}={sweep_dir} held only the mark of a sweep that ended before any job "
                f"({claim.took_over}); took the folder over",
                file=sys.stderr,
            )
        measured = measure()  # outside the wait's note: it is not the database being waited for
        with waiting_for_database(url):
            claim.keep()  # a stop during the write may leave the row: from here the folder is its
            try:
                sweep_id = store.start_sweep(engine, sweep_dir, name, **fields, **measured)
            except Exception as exc:  # noqa: BLE001
                with contextlib.suppress(Exception):  # unknown: kept (a row may hold the folder)
                    # the row's insert and its update are two writes: the folder is the row's if the first took
                    claim.kept = store.sweep_of(engine, sweep_dir) is not None
                raise ConfigError(
                    f"cannot write to db.url={hide_db_url(url)!r}: {first_line(exc)}{_db_hint(url, exc)}"
                ) from None
            claim.stamp(sweep_id)
    finally:
        engine.dispose()
    if new_folder:  # a typo in the path would otherwise scatter results into a database of its own, unsaid
        print(f"perfsweep: db.url's folder {folder} did not exist; created it with a new database", file=sys.stderr)
    return sweep_id, measured


def placements(cfgs: list[PerfsweepConfig], hydra_launcher: str = "BasicLauncher") -> list[Any]:
    """The slots of ``launcher.parallel`` (perfsweep.slots); also checks that every grid point's
    ranks fit this machine. Concurrency is perfsweep's own only under Hydra's basic launcher."""
    from perfsweep import slots

    first = cfgs[0]
    parallel = first.launcher.parallel
    if parallel == 1 and hydra_launcher in MULTI_HOST_LAUNCHERS:
        return [slots.Placement(0)]  # the jobs' hosts are not this one: their GPUs and cores are theirs
    if parallel > 1 and hydra_launcher != "BasicLauncher":
        raise ConfigError(
            f"invalid config: launcher.parallel={parallel}: runs jobs side by side under Hydra's basic launcher; "
            f"with {hydra_launcher} set that launcher's own concurrency (e.g. hydra.launcher.n_jobs, "
            "hydra.launcher.array_parallelism)"
        )
    # device=cuda on a machine without one is check_device's to refuse, in its own words
    on_cuda = any(c.device != Device.cpu for c in cfgs) and slots.cuda_available()  # torch asked last
    if first.launcher.gpus_per_job is not None and not on_cuda:
        where = "device=cpu" if all(c.device == Device.cpu for c in cfgs) else "this machine, which has no CUDA device"
        raise ConfigError(
            f"invalid config: launcher.gpus_per_job={first.launcher.gpus_per_job}: splits GPUs between jobs; "
            f"the jobs run on CPU ({where}): leave it unset"
        )
    nproc = max(c.nproc or 1 for c in cfgs)
    cpus = slots.allowed_cpus()
    placements = slots.plan(
        parallel, on_cuda, nproc, first.launcher.gpus_per_job, cpus, slots.visible_gpus() if on_cuda else []
    )
    threads = max((c.threads or 0) for c in cfgs)
    per_job = len(placements[0].cpus) if placements[0].cpus else len(cpus)
    if threads * max(1, nproc) > per_job and (parallel > 1 or nproc > 1):
        raise ConfigError(
            f"invalid config: threads={threads}: each job has {per_job} CPU core(s) for {nproc} rank(s) "
            f"(launcher.parallel={parallel}); set threads<={max(1, per_job // nproc)} or null (its share)"
        )
    return placements


def at_once(launcher_cfg: Any, hydra_launcher: str, n_jobs: int, placements: list[Any]) -> int:
    """The most jobs that may run at once: perfsweep's slots under Hydra's basic launcher, else the
    launcher's own setting (joblib's ``n_jobs``, -1 meaning every CPU; SLURM's
    ``array_parallelism``; submitit_local runs them all), never more than the jobs there are:
    ``sweeps.parallel``."""
    if hydra_launcher == "BasicLauncher":
        return min(len(placements), n_jobs)
    if hydra_launcher == "LocalLauncher":  # submitit's local executor starts every job at once
        return n_jobs
    from perfsweep import slots

    n = launcher_cfg.get("n_jobs") or launcher_cfg.get("array_parallelism") or 1
    if n < 0:  # joblib counts the CPUs it may use (loky's cpu_count: a cgroup's quota too)
        n = len(slots.allowed_cpus()) + 1 + n
    return max(1, min(int(n), n_jobs))


def filesystem_type(path: str | Path, mounts: str | Path = "/proc/mounts") -> str | None:
    """The type of the filesystem ``path`` lives on (its longest mount point in ``mounts``,
    /proc/mounts' format, where a space in a mount point is written \\040); None when unknown."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, fstype = "", None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # over-mounted: the last entry at a point is the visible one
            best, fstype = point, parts[2]
    return fstype


def check_db_for_hosts(url: str, hydra_launcher: str, mounts: str | Path = "/proc/mounts") -> None:
    """Jobs on several hosts (SLURM) each write their own row: a SQLite file on a network filesystem
    would take those writes with locks it does not honour, and lose or corrupt rows. Refused
    before anything is submitted; PostgreSQL is the database for that."""
    if hydra_launcher not in MULTI_HOST_LAUNCHERS or not url.startswith("sqlite"):
        return
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database:
        return
    folder = Path(os.path.realpath(database)).parent  # symlinks followed where they exist
    fstype = filesystem_type(folder, mounts)
    if fstype is not None and fstype.split(".")[-1] in NETWORK_FILESYSTEMS:
        raise ConfigError(
            f"invalid config: db.url={url!r}: a SQLite file on {fstype} ({folder}) is not safe for jobs on several "
            f"hosts ({hydra_launcher}): its file locks do not hold across machines; use PostgreSQL, e.g. "
            "db.url=postgresql+psycopg2://user@dbhost/perfsweep"
        )


def check_all(
    cfgs: list[PerfsweepConfig], jobs_run_here: bool = True, hydra_launcher: str = "BasicLauncher"
) -> list[Any]:
    """The checks that need no database, cheapest first; returns the jobs' :func:`placements`.
    (What the database's URL says alone is asked before them: :func:`check_db_url`.)

    The text files first: a listing. Then the device and the placements, which ask torch whether
    it sees a GPU where a job may run on one: on a CUDA build that imports torch in this process
    and starts CUDA's driver, seconds (docs/benchmarks.md, "A refusal on a GPU machine"), so a
    mistyped data.path is answered before it. Then the tokenizing, which a large corpus not yet in
    the cache makes the longest of them (minutes for gigabytes), so a mistyped setting is answered
    before it. Then the models on their first batch, with torch: in a process forked from the job
    server where the jobs will be (perfsweep.job_start.call), and only where there is something
    to check (a model of the user's, what ``ckpt=true`` wraps in ours).

    ``jobs_run_here`` false (SLURM: the jobs run on other hosts, often with GPUs a login node
    lacks): this machine's devices are not the jobs', so they are not checked."""
    from perfsweep import job_start

    check_text_files(cfgs)
    if jobs_run_here:
        check_device(cfgs)
    found = placements(cfgs, hydra_launcher)
    prepared = check_data(cfgs)
    if backends := sorted({c.compile_backend for c in cfgs if c.compile and c.compile_backend != "inductor"}):
        job_start.call(check_compile_backends, backends)  # with torch, where the jobs will be
    if checked := sorted({c.model._target_ for c in cfgs if c.model._target_ != GPT_TARGET or c.ckpt}):
        try:
            job_start.call(check_models, cfgs, prepared)
        except job_start.CallDied as exc:  # a crash in the model's code (a segfault, an os._exit)
            raise ConfigError(
                f"invalid config: model._target_={', '.join(map(repr, checked))}: checking the model on one "
                f"batch ended its process (exit code {exc.exitcode}): a crash or an exit "
                "in the model's code"
            ) from None
    return found


def resume_points(url: str, sweep_dir: str, grid: list[tuple[int, str]], searched: set[int]) -> set[tuple[int, str]]:
    """(job_num, config_hash) of the grid points of the sweep in ``sweep_dir`` that have an ``ok``
    run, or, for a batch=max point, a search that found its answer (names.SEARCH_ANSWERED); opening
    the database marks dead runs first. ``grid``: this command's (job_num, config_hash) per grid
    point, ``searched``: the job numbers of its batch=max searches.

    Refused when the database holds no sweep for the folder (a resume typed by hand without the
    sweep's db.url started a new sweep in ./results.db inside the old sweep's folder and wrote
    over its report), or when the stored runs are of another grid (an override added or changed:
    its points were appended to the old sweep, which then mixed two grids), counting the results
    the sweep kept as result.json, which the resume stores next (perfsweep.importer.store_kept).
    """
    from sqlalchemy import select

    from perfsweep import store

    no_sweep = ConfigError(
        f"resume=true: db.url={hide_db_url(url)!r} holds no sweep for {sweep_dir}; give the db.url the sweep "
        "was run with, or resume it by its id with: perfsweep resume SWEEP --db DB"
    )
    if (path := store.sqlite_file(url)) is not None and not path.exists():
        raise no_sweep  # not made by opening it: a refused resume left an empty database, and its folder
    try:
        with waiting_for_database(url):
            engine = store.connect(url)
    except Exception as exc:  # noqa: BLE001 - any driver error; its first line says what
        raise ConfigError(f"cannot open db.url={hide_db_url(url)!r}: {first_line(exc)}") from None
    try:
        with store.session(engine) as s:
            sweep = s.scalars(select(store.Sweep).where(store.Sweep.sweep_dir == sweep_dir)).first()
            if sweep is None:
                raise no_sweep
            rows = s.execute(
                select(store.Run.job_num, store.Run.config_hash, store.Run.status, store.Run.batch_search_id).where(
                    store.Run.sweep_id == sweep.id
                )
            ).all()
            answered = s.scalars(  # a search's first try keeps the search's place in the plan
                select(store.Run.job_num)
                .join(store.BatchSearch, store.Run.batch_search_id == store.BatchSearch.id)
                .where(store.BatchSearch.sweep_id == sweep.id, store.BatchSearch.status.in_(SEARCH_ANSWERED))
            ).all()
            n_jobs, command, sweep_id = sweep.n_jobs, sweep.command, sweep.id
    finally:
        engine.dispose()
    from perfsweep import importer  # a resume stores these first: of another grid, it is refused before

    kept = [
        (r.get("job_num"), r.get("config_hash"), r.get("status"), r.get("batch_search_id"))
        for r in importer.kept_runs(importer.kept_of_sweep(url, sweep_dir))
    ]
    points = set(grid)
    other = [  # a search's tries carry their own batches' hashes, never the grid point's
        j
        for j, h, _, search_id in [*rows, *kept]
        if isinstance(j, int) and j < len(grid) and search_id is None and (int(j), h) not in points
    ]
    if (n_jobs is not None and n_jobs != len(grid)) or other:
        differs = _what_differs(command, store.typed_command())
        raise ConfigError(
            f"resume=true: the grid is not that of sweep {sweep_id} in {sweep_dir} ({n_jobs} grid points, run as: "
            f"{store.hide_password(command or '')}){differs}; resume it with the same overrides, e.g. perfsweep resume {sweep_id} --db {hide_db_url(url)}, or run "
            "the new grid as a new sweep (without hydra.sweep.dir)"
        )
    hash_of = dict(grid)
    searches_done = {(int(j), hash_of[int(j)]) for j in answered if j is not None and int(j) in searched}
    return {(int(j), h) for j, h, status, _ in rows if j is not None and status == "ok"} | searches_done


def _what_differs(stored: str | None, typed: str) -> str:
    """For the refusal of a resume whose grid is not its sweep's: the overrides that differ between
    the sweep's stored command and this one (``; here steps.measure=3, in the sweep
    steps.measure=1000``), where both can be read; else nothing. The refusal named the sweep's
    command alone, and a person had to find the difference in two long lines. Values in another
    order are another grid too: the order numbers the jobs."""

    def overrides(command: str) -> dict[str, str] | None:
        try:
            words = shlex.split(command)[1:]
        except ValueError:
            return None
        skip = ("hydra.sweep.dir=", "resume=", "db.url=")
        return {k: v for k, _, v in (w.partition("=") for w in words if "=" in w and not w.startswith(skip))}

    was, now = overrides(stored or ""), overrides(typed)
    if not stored or was is None or now is None:
        return ""
    keys = [k for k in dict.fromkeys([*now, *was]) if now.get(k) != was.get(k)]
    if not keys:
        return ""
    shown = keys[:3]

    def side(values: dict[str, str]) -> str:
        return ", ".join(f"{k}={values[k]}" if k in values else f"no {k}" for k in shown)

    reordered = any(k in now and k in was and sorted(now[k].split(",")) == sorted(was[k].split(",")) for k in shown)
    order = " (the order of a key's values numbers the jobs)" if reordered else ""
    more = f", and {len(keys) - 3} more" if len(keys) > 3 else ""
    return f"; here {side(now)}, in the sweep {side(was)}{more}{order}"


@dataclass
class Claim:
    """A sweep's hold on its folder (:func:`claim_folder`). Until the sweep's row is written the
    folder is no sweep's yet, and a refusal or a stop (Ctrl-C, SIGTERM, SIGHUP) hands it back as it
    was (:meth:`release`): the marker left by a SIGTERM during the CPU's peak measure, 2.5 s of a
    sweep's start, had the same command refused as "another sweep", and ``resume=true`` refused
    it as "no sweep" (the database had none). From the write on (:meth:`keep`) the folder is the
    row's, kept whatever comes."""

    folder: Path
    key: str
    """The setting that named the folder: ``hydra.sweep.dir`` or ``hydra.run.dir``."""
    created: list[Path]
    """The folders :func:`claim_folder` made, deepest first: removed by a release where empty."""
    owned: bool
    """False on a resume: the marker is the earlier sweep's, and no refusal of the resume removes it
    (one did: a resume refused for a read-only database left that sweep unresumable)."""
    kept: bool = False
    took_over: str | None = None
    """Whose abandoned marker this claim replaced, as :func:`_abandoned` tells it."""

    def keep(self) -> None:
        """Called as the sweep's row is about to be written: a stop during that write may have left
        the row, whose folder and marker then stay."""
        self.kept = True

    def stamp(self, sweep_id: int) -> None:
        """Write the sweep's id into the marker once its row is written: a marker without one whose
        sweep has ended was left before any row (:func:`_abandoned`), and is taken over."""
        if self.owned:
            with contextlib.suppress(OSError), open(self.folder / SWEEP_MARKER, "a") as fh:
                fh.write(f"sweep_id={sweep_id}\n")

    def release(self) -> None:
        """Undo the claim, if it is this sweep's and not yet kept: no marker, no empty folders."""
        if not self.owned or self.kept:
            return
        with contextlib.suppress(OSError):  # FileNotFoundError, or NotADirectoryError: a file on the path
            (self.folder / SWEEP_MARKER).unlink()
        for p in self.created:  # deepest first
            try:
                p.rmdir()
            except OSError:
                break
        self.created, self.owned = [], False  # once: a second call must not take a marker made since


def claim_folder(folder: Path, key: str, resume: bool = False, launch_dir: Path | None = None) -> Claim:
    """Make ``folder`` this sweep's own, atomically, or raise before any job starts.

    The folder is the sweep's identity: its rows are keyed by it and its jobs' folders and
    artifacts live in it. The default folder names carry a random part, so concurrent sweeps
    never meet; a folder set by hand (``key``: ``hydra.sweep.dir`` or ``hydra.run.dir``) that
    another sweep already used is refused rather than shared, unless ``resume=true`` asks to
    continue the sweep in it. ``launch_dir``: where the command was run (the working directory
    where not given), for :func:`_sweep_around`.
    """
    marker = folder / SWEEP_MARKER
    if resume:
        if not marker.is_file():
            raise ConfigError(
                f"resume=true: {key}={folder} holds no perfsweep sweep ({SWEEP_MARKER} not found); "
                "name the folder of the sweep to resume, or use: perfsweep resume SWEEP"
            )
        return Claim(folder, key, [], owned=False)
    if (outer := _sweep_around(folder, Path.cwd() if launch_dir is None else launch_dir)) is not None:
        raise ConfigError(
            f"{key}={folder} is inside the folder of another sweep ({outer}), whose jobs' folders and files are "
            f"its own; set {key} to a folder outside it"
        )
    claim = Claim(folder, key, [p for p in (folder, *folder.parents) if not p.exists()], owned=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        left = _abandoned(folder)
        with os.fdopen(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644), "w") as fh:
            fh.write(f"pid={os.getpid()} host={socket.gethostname()} started={time.time():.0f}\n")
    except OSError as exc:
        odd = marker.is_dir() or (marker.is_symlink() and not marker.exists())  # a folder, or a link to none
        if isinstance(exc, FileExistsError) and folder.is_dir() and not odd:
            # the marker was there as this one was made; gone since, another sweep is taking it over
            then = ", or with -m add resume=true to continue it" if key == "hydra.sweep.dir" else ""
            raise ConfigError(
                _stale_lock(folder, key)
                or f"{key}={folder} already holds another sweep ({SWEEP_MARKER} exists); give each sweep its "
                f"own folder (the default one is unique){then}"
            ) from None
        claim.release()  # a full disk, no permission, a file on the path: in one line
        if isinstance(exc, FileExistsError) and odd:
            raise ConfigError(  # "a file stands where the folder would be" misled
                f"{key}={folder}: its {SWEEP_MARKER} is a folder or a link, not perfsweep's mark of a sweep; "
                f"remove it, or set {key} to another place"
            ) from None
        if isinstance(exc, FileExistsError | NotADirectoryError):
            what = "a file stands where the folder, or one above it, would be; set"
        else:
            what = "free space or permission there, or set"
        raise ConfigError(
            f"{key}={folder}: cannot create the sweep's folder ({exc.strerror or exc}); {what} {key} to another place"
        ) from None
    claim.took_over = left  # said by reserve_sweep, once it knows the database has no sweep of the folder
    return claim


def _sweep_around(folder: Path, launch_dir: Path) -> Path | None:
    """The folder of a multirun sweep that ``folder`` would be inside, links followed; None if
    none. Such a sweep was not refused: its jobs' folders took a sweep of their own (its
    ``.hydra``, ``multirun.yaml``, jobs and marker written in beside another sweep's trace), and
    so did its ``report`` folder. Not a sweep's folder the command was launched in or under
    (``hydra.sweep.dir=.`` makes the launch folder a sweep's): the default folders of every later
    sweep and run launched there are under it, and were never refused."""
    launched = launch_dir.resolve()
    for above in folder.resolve().parents:
        if above == launched or above in launched.parents:
            return None
        if (above / SWEEP_MARKER).is_file() and (above / "multirun.yaml").is_file():
            return above
    return None


EMPTY_MARK_AGE_S = 60.0
"""How old an empty marker must be to be taken for abandoned (:func:`_abandoned`). A sweep writes
its marker's line microseconds after making it (:func:`claim_folder`); only a kill in between
leaves it empty, so a minute is far past any sweep still about to write it."""

TAKING_LOCK = f"{SWEEP_MARKER}.taking"
"""The lock file :func:`_abandoned` holds while it looks at a marker."""

TAKING_LOCK_AGE_S = 10.0
"""How old the takeover lock must be to be named as left behind (:func:`_stale_lock`): it is
held for the microseconds a marker is read and removed."""


def _abandoned(folder: Path) -> str | None:
    """Whose marker ``folder`` held, said for the takeover's line, where that marker was a claim
    no row holds and is now removed; None where there is no such marker (none, or a live or
    finished sweep's).

    A sweep killed (SIGKILL) in its first seconds, or stopped while it waited on a locked database
    to write its row (:class:`Claim` keeps the folder from the write on), left a marker without a
    row: the same command was refused as "another sweep", and resume=true as "no sweep". Such a
    marker has no ``sweep_id`` (:meth:`Claim.stamp`), was written on this host by a process that
    is gone, and is alone in the folder with, for a plain run, Hydra's own files: a sweep that
    wrote its row has its ``multirun.yaml``, its jobs' folders or its job's log there too. An
    empty marker (killed between making it and writing its line) names no process: it is taken
    over once :data:`EMPTY_MARK_AGE_S` old, alone in its folder likewise.

    Looked at and removed under a lock file of its own, so that a sweep that read the old marker
    never removes the one another sweep has just made in its place; the new marker itself is
    made with O_EXCL by :func:`claim_folder`, so of sweeps started at once one claims the folder.
    A lock left by a process killed in between keeps the marker, and the refusal names the lock
    (:func:`_stale_lock`)."""
    from perfsweep.job_start import pid_running

    marker, lock = folder / SWEEP_MARKER, folder / TAKING_LOCK
    if not marker.is_file() or not Path("/proc/self").exists():  # without /proc, a process cannot be told gone
        return None
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except OSError:  # another sweep is looking, or cannot write here: claim_folder answers
        return None
    try:
        text = marker.read_text()
        entries = {p.name for p in folder.iterdir()} - {lock.name}
        if not entries <= {SWEEP_MARKER, *HYDRA_RUN_FILES}:
            return None
        if not text:
            if time.time() - marker.stat().st_mtime < EMPTY_MARK_AGE_S:
                return None
            marker.unlink()
            return "its mark was empty: killed as it made it"
        fields = dict(w.split("=", 1) for w in text.split() if "=" in w)
        pid = int(fields["pid"])
        if "sweep_id" in fields or fields.get("host") != socket.gethostname() or pid_running(pid):
            return None
        marker.unlink()
        return f"pid {pid} on this host: killed, or stopped while it waited for the database"
    except (OSError, KeyError, ValueError):  # gone, unreadable, not ours: not taken over
        return None
    finally:
        lock.unlink(missing_ok=True)


def _stale_lock(folder: Path, key: str) -> str | None:
    """The refusal of a folder whose marker is kept, where :func:`_abandoned`'s lock has been there
    longer than it is ever held (a sweep killed while it held it): that lock keeps every later
    sweep from looking at the marker, so the plain "another sweep" line would be said for good,
    whatever the marker holds. None otherwise."""
    lock = folder / TAKING_LOCK
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return None
    if age < TAKING_LOCK_AGE_S:
        return None
    return (
        f"{key}={folder} holds a sweep's mark ({SWEEP_MARKER}) that cannot be looked at: {lock}, left by a "
        f"sweep killed while it looked, keeps perfsweep from telling whether that sweep has ended; remove "
        f"{TAKING_LOCK} there if no perfsweep is starting in the folder, then run again, or give this sweep "
        "its own folder"
    )


HYDRA_RUN_FILES = frozenset({".hydra", "__main__.log"})
"""What Hydra writes into a plain run's folder before perfsweep's code runs."""


_RUN_FOLDER_BEFORE: tuple[Path, Path, frozenset[str] | None] | None = None
"""A plain run's folder as Hydra was about to make it (:class:`RunFolderNote`): the folder, the
deepest of it and its parents that existed then, and the folder's entries where it existed."""


class RunFolderNote(Callback):
    """A Hydra callback (conf/config.yaml, ``hydra.callbacks``) that notes, before Hydra makes a
    plain run's folder, what of it was there already: a run refused or stopped before its row
    removes what Hydra made for it and only that (:func:`remove_refused_run_folder`). Without it,
    an empty folder the user had made (``mkdir -p runs/a`` for ``hydra.run.dir=runs/a``) was
    taken for Hydra's and removed, with its parent."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        global _RUN_FOLDER_BEFORE
        with contextlib.suppress(Exception):  # a folder that cannot be told is one nothing is removed from
            folder = Path(str(config.hydra.run.dir)).resolve()  # as the run's own code names it: links followed
            root = next(p for p in (folder, *folder.parents) if p.exists())
            entries = frozenset(os.listdir(folder)) if root == folder else None
            _RUN_FOLDER_BEFORE = (folder, root, entries)


def hide_passwords_in_files(*paths: Path) -> None:
    """Rewrite each YAML file of ``paths`` that holds a database password with the password as
    ``***`` (:func:`hide_password_in_word` on every string in it); a file without one, or not
    there, is left as it is.

    Hydra writes every job's settings to its folder (``.hydra/config.yaml``, ``hydra.yaml`` with
    the overrides and the folder name made of them, ``overrides.yaml``) and perfsweep the sweep's
    to ``multirun.yaml``: a ``db.url=postgresql://me:secret@host/db`` typed on the command line was
    kept there in clear, in every job folder, where the database and every message hide it. The
    strings are read as YAML, not as lines: a long value can be folded onto the next line."""
    for path in paths:
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            if "@" not in text and "password=" not in text.lower():  # no password to hide: not read as YAML
                continue
            before = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
            after = _hide_in_strings(before)
            if after != before:
                tmp = path.with_name(f".{path.name}.hiding")
                OmegaConf.save(OmegaConf.create(after), tmp)
                tmp.replace(path)
        except Exception as exc:  # noqa: BLE001 - a record of the settings must not stop the job that runs them
            print(f"perfsweep: could not hide the database password in {path}: {first_line(exc)}", file=sys.stderr)


def _hide_in_strings(value: object) -> object:
    if isinstance(value, str):
        return hide_password_in_word(value)
    if isinstance(value, dict):
        return {k: _hide_in_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hide_in_strings(v) for v in value]
    return value


def remove_refused_run_folder(folder: Path | None = None) -> None:
    """A plain run refused or stopped before its row leaves no trace: the folders Hydra made for
    it go, with Hydra's files in them (the date folder, ``outputs/`` where the launch directory had
    none), and from a folder that was there before (``hydra.run.dir=.``, a folder of the user's)
    only the files Hydra added. A folder that holds anything else (an earlier run's) is kept, and
    nothing is removed where what was there before is not known (:class:`RunFolderNote`).
    ``folder`` None: the one noted, for a stop while Hydra made it, before the run's code ran."""
    import shutil

    if _RUN_FOLDER_BEFORE is None or (folder is not None and _RUN_FOLDER_BEFORE[0] != folder.resolve()):
        return
    folder = _RUN_FOLDER_BEFORE[0]
    _, root, entries = _RUN_FOLDER_BEFORE
    if entries is not None:  # the user's folder: what Hydra added to it goes
        for name in HYDRA_RUN_FILES - entries:
            path = folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return
    if folder.exists():  # not yet, where the stop came as Hydra made the folders above it
        if not (folder.is_dir() and {p.name for p in folder.iterdir()} <= HYDRA_RUN_FILES):
            return
        shutil.rmtree(folder, ignore_errors=True)
    for parent in folder.parents:  # the empty folders Hydra made above it for this run
        if parent == root:
            break
        try:
            parent.rmdir()
        except FileNotFoundError:  # not made yet: the stop came between makedirs' mkdir calls
            continue
        except OSError:  # not empty: made meanwhile by another run
            break
