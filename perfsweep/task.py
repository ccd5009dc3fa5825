"""The model contract: how perfsweep builds any model, turns a batch into a loss and counts work.

A user points ``model._target_`` at a factory that returns an ``nn.Module`` (perfsweep's GPT is
one such factory, :func:`perfsweep.model.build`), and says in ``model.*`` (config.ModelConfig)
how a step gets its loss and what its throughput counts. Everything here is the one training
path every model takes:

- **Build.** Hydra's ``instantiate`` calls the factory with the ``model`` node's own keys, plus
  ``vocab_size`` (token data) and ``seq_len`` where the factory's signature takes them.
- **A batch** is a tensor, a tuple/list or a dict of tensors; :func:`to_device` moves every
  tensor in it. Its *input* is the tensor, the first item, or ``input_ids`` (else the first
  value) of a dict; a step's tokens are the input's elements, its samples the input's rows.
- **The loss.** ``loss=output``: the batch is the forward's arguments (a tuple positionally, a
  dict by name) and the forward returns the loss: a scalar tensor, a mapping with ``loss`` or an
  object with ``.loss``. ``loss=cross_entropy``/``mse``: the batch is (inputs, targets), or a
  dict whose ``labels`` (or ``targets``) are the targets; the forward returns predictions.
- **Checkpointing** wraps the ``model.ckpt_modules`` classes with torch's non-reentrant
  ``apply_activation_checkpointing``, or calls ``gradient_checkpointing_enable()`` (``ckpt_impl=hf``).
- **FLOPs.** A model with a formula (a ``flops_per_token(seq_len)`` method, like our GPT) uses it;
  any other is counted by torch's ``FlopCounterMode`` over one forward and backward, without
  checkpointing so recomputation is not counted: on the meta device (no memory, no kernels), or
  where a model's forward needs real values, on one sample of the job's first batch before warmup.

:func:`check` runs the same step before any job starts (on the meta device, or for a model the
meta device cannot run, on the CPU on one sample), so a factory that cannot be imported,
returns no module or whose forward gives no loss is refused in one line.
"""

from __future__ import annotations

import errno
import importlib
import inspect
import logging
import re
import traceback
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from perfsweep.cli import first_line
from perfsweep.config import CkptImpl, ConfigError, Loss, ModelConfig, Unit
from perfsweep.names import CPU_CHECK_MAX_PARAMS

log = logging.getLogger(__name__)

Batch = Any
"""A tensor, a tuple/list of tensors or a dict of tensors."""

LossFn = Callable[[nn.Module, Batch], torch.Tensor]


class ContractError(ConfigError):
    """The model or its batches break the contract; one line naming ``_target_`` and what was expected."""

    cause: BaseException | None = None
    """What the user's code raised, where it raised (:func:`meta_step` tells the meta device's limits apart)."""


def offered_kwargs(fn: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The ``offered`` keyword arguments ``fn`` names in its signature (``**kwargs`` takes none:
    it usually forwards to a config class that would refuse them)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {k: v for k, v in offered.items() if k in params and params[k].kind in named}


UNDER_ADDRESS_LIMIT = re.compile(r"resource temporarily unavailable|^could not create a primitive$")
"""What a RuntimeError says when an address-space limit (``job_memory_limit_mib``) ran out
somewhere other than torch's allocator: a thread pool's thread that could not get its stack
(EAGAIN), oneDNN that could not map its kernel's code or scratchpad (that message exactly: "could
not create a primitive descriptor for ..." is an operation oneDNN does not support, no memory
matter). Measured on the tiny GPT at limits of 10 and 20 MiB, stored ``failed`` where 40 MiB gave
the allocator's own ``oom``."""


ALLOCATION_FAILED = ("out of memory", "can't allocate memory", "cannot allocate memory", "std::bad_alloc")
"""What a RuntimeError says where an allocation failed, on any device: torch's allocators, the
kernel's ENOMEM text passed on by a library, and C++'s ``std::bad_alloc`` as torch forwards it."""


def is_oom(exc: BaseException) -> bool:
    """An allocator failure on any device: torch's OutOfMemoryError, MemoryError, an OSError of
    ENOMEM (the kernel's "Cannot allocate memory": a memory map that does not fit, as the token
    file's under a 5 MiB limit), or the plain RuntimeError the CPU allocator raises; also, under
    an address-space limit, :data:`UNDER_ADDRESS_LIMIT`: the same exhaustion, reached through a
    thread pool or oneDNN instead."""
    # torch.cuda's name, in every torch: torch.OutOfMemoryError (the same class) is not in 2.3, where an
    # old install's errors must still be classified (names.OLDEST_TORCH)
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOMEM
    text = str(exc).strip().lower()
    if isinstance(exc, RuntimeError) and UNDER_ADDRESS_LIMIT.search(text):
        import resource

        return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY
    return isinstance(exc, RuntimeError) and any(w in text for w in ALLOCATION_FAILED)


_CPU_ALLOCATOR_CHECK = re.compile(r"^\[enforce fail at [^\]]*\] err == 0\.\s*")


def error_text(exc: BaseException) -> str:
    """``Type: message`` as a run stores it, with the words that say what happened first: the
    CPU allocator's C++ check (``[enforce fail at alloc_cpu.cpp:127] err == 0.``) goes, so a cut
    line keeps "can't allocate memory: you tried to allocate N bytes", and a bare MemoryError
    (Python's, with no message) says what it means."""
    text = _CPU_ALLOCATOR_CHECK.sub("", str(exc).strip())
    if not text and isinstance(exc, MemoryError):
        text = "an allocation failed: the process ran out of memory (or hit job_memory_limit_mib)"
    return f"{type(exc).__name__}: {text}"


def call_factory(node: str, target: str, args: dict[str, Any], offered: dict[str, Any]) -> Any:
    """Import ``target`` and call it through Hydra's ``instantiate`` (nested ``_target_`` nodes in
    ``args`` are built too); every failure is one line naming ``{node}._target_``."""
    from hydra.utils import get_object, instantiate

    hydra_log = logging.getLogger("hydra.utils")  # it logs a failed import in three lines of its own
    level, hydra_log.disabled = hydra_log.disabled, True
    try:
        fn = get_object(target)
    except Exception as exc:  # noqa: BLE001 - ImportError, AttributeError...: all say the same
        module, _, name = target.rpartition(".")
        try:  # the module imports but lacks the name: say that, not Hydra's "is not a package"
            found = importlib.import_module(module)
            why = f"module {module!r} has no attribute {name!r}" if not hasattr(found, name) else None
        except Exception:  # noqa: BLE001 - the module itself does not import: Hydra's cause says why
            why = None
        cause = exc.__cause__ or exc
        why = why or f"{type(cause).__name__}: {_first(cause)}"
        raise ContractError(
            f"invalid config: {node}._target_={target!r}: cannot import it ({why}); it must be importable "
            "from the launch directory or PYTHONPATH"
        ) from None
    finally:
        hydra_log.disabled = level
    if not callable(fn):
        raise ContractError(f"invalid config: {node}._target_={target!r}: is a {type(fn).__name__}, not a callable")
    offered = {k: v for k, v in offered.items() if k not in args and v is not None}  # the user's keys win
    try:
        return instantiate({"_target_": target, **args}, **offered_kwargs(fn, offered), _convert_="all")
    except Exception as exc:  # noqa: BLE001 - the user's factory: whatever it raises is the answer
        cause = exc.__cause__ or exc
        if is_oom(cause):
            raise cause from None  # a model too large for the device is a result (status oom), not a bad config
        err = ContractError(
            f"invalid config: {node}._target_={target!r}: the factory raised {type(cause).__name__}: {_first(cause)}"
        )
        err.cause = cause
        raise err from None


def build_model(cfg: ModelConfig, vocab_size: int | None, seq_len: int | None) -> nn.Module:
    """The module the factory returns, built on the current default device."""
    model = call_factory("model", cfg._target_, cfg.args, {"vocab_size": vocab_size, "seq_len": seq_len})
    if not isinstance(model, nn.Module):
        raise ContractError(
            f"invalid config: model._target_={cfg._target_!r}: returned {type(model).__name__}, "
            "expected a torch.nn.Module"
        )
    return model


def _class_names(m: nn.Module) -> set[str]:
    cls = type(m)
    return {cls.__name__, f"{cls.__module__}.{cls.__qualname__}"}


def apply_checkpointing(model: nn.Module, cfg: ModelConfig) -> int:
    """Activation checkpointing for ``ckpt=true``; returns how many submodules it wraps (0 for hf)."""
    where = f"ckpt=true with model._target_={cfg._target_!r}"
    if cfg.ckpt_impl == CkptImpl.hf:
        if not hasattr(model, "gradient_checkpointing_enable"):
            raise ContractError(
                f"invalid config: model.ckpt_impl='hf': {where}: the module has no "
                "gradient_checkpointing_enable(); use ckpt_impl=torch with model.ckpt_modules"
            )
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return 0
    names = set(cfg.ckpt_modules)
    matched = [m for m in model.modules() if m is not model and _class_names(m) & names]
    if not matched:
        present = sorted({type(m).__name__ for m in model.modules() if m is not model and list(m.children())})
        raise ContractError(
            f"invalid config: model.ckpt_modules={sorted(names)}: {where}: no submodule has such a class, "
            f"so nothing would be checkpointed; name block classes of the model ({', '.join(present[:12]) or 'none'})"
        )
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: bool(_class_names(m) & names),
    )
    return len(matched)


def to_device(batch: Batch, device: torch.device | str) -> Batch:
    """Every tensor of the batch on ``device``, copied without blocking the host (pinned memory)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return _same_kind(batch, [to_device(v, device) for v in batch])
    return batch


def _first(exc: BaseException) -> str:
    """The error's first line; one raised with no message (transformers' ``ImportError`` where it
    has disabled itself for an older torch) is named by where it was raised, the line to open."""
    if str(exc).strip():
        return first_line(str(exc))
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "(no message)"
    return f"(no message; raised at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})"


def _same_kind(seq: tuple | list, items: list[Any]) -> tuple | list:
    """``items`` in a sequence of ``seq``'s type: a NamedTuple is built from positional fields."""
    return type(seq)(*items) if hasattr(seq, "_fields") else type(seq)(items)


def _describe(x: Any, depth: int = 0) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {str(x.dtype).removeprefix('torch.')} tensor of shape {tuple(x.shape)}"
    if isinstance(x, Mapping):
        return f"a {type(x).__name__} with keys {sorted(map(str, x))[:6]}"
    if isinstance(x, (tuple, list)) and x and depth < 2:
        return f"a {type(x).__name__} of {len(x)} whose first item is {_describe(x[0], depth + 1)}"
    return f"a {type(x).__name__}"


def batch_input(batch: Batch) -> torch.Tensor:
    """The tensor whose elements are a step's tokens and whose rows are its samples."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping) and batch:
        first = batch.get("input_ids", next(iter(batch.values())))
    elif isinstance(batch, (tuple, list)) and batch:
        first = batch[0]
    else:
        first = None
    if not isinstance(first, torch.Tensor):
        raise ContractError(
            f"a batch is {_describe(batch)}; expected a tensor, a tuple/list of tensors or a dict of tensors"
        )
    return first


def units(batch: Batch, unit: Unit) -> tuple[int | None, int]:
    """(tokens, samples) in one batch: its input's rows, and for ``unit=tokens`` rows x positions
    (the input's first two dimensions: token ids (B, T), or embeddings (B, T, D)); tokens is None
    for ``unit=samples``."""
    x = batch_input(batch)
    samples = int(x.shape[0]) if x.dim() else 1
    if unit != Unit.tokens:
        return None, samples
    return samples * (int(x.shape[1]) if x.dim() >= 2 else 1), samples


def _call(model: nn.Module, inputs: Batch) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _loss_from_output(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else None
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    return loss if isinstance(loss, torch.Tensor) and loss.dim() == 0 else None


def _predictions(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    logits = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)) and out:
        logits = out[0]
    return logits if isinstance(logits, torch.Tensor) else None


def _split_targets(batch: Batch) -> tuple[Batch, torch.Tensor]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, Mapping):
        key = "labels" if "labels" in batch else "targets" if "targets" in batch else None
        if key is not None:
            return {k: v for k, v in batch.items() if k != key}, batch[key]
    raise ContractError(
        f"a batch is {_describe(batch)}; a model that returns predictions needs (inputs, targets) "
        "or a dict with 'labels' or 'targets'"
    )


def loss_function(cfg: ModelConfig) -> LossFn:
    """``loss_fn(model, batch) -> scalar loss tensor`` for ``model.loss``."""
    target = cfg._target_

    def output(model: nn.Module, batch: Batch) -> torch.Tensor:
        out = _call(model, batch)
        loss = _loss_from_output(out)
        if loss is None:
            raise ContractError(
                f"invalid config: model._target_={target!r}: with model.loss=output the forward must return "
                f"a scalar loss tensor, a mapping with 'loss' or an object with .loss, but it returned "
                f"{_describe(out)}; set model.loss=cross_entropy (or mse) if it returns predictions"
            )
        return loss

    def predicted(model: nn.Module, batch: Batch) -> torch.Tensor:
        inputs, targets = _split_targets(batch)
        out = _call(model, inputs)
        pred = _predictions(out)
        if pred is None:
            raise ContractError(
                f"invalid config: model._target_={target!r}: with model.loss={cfg.loss.value} the forward "
                f"must return predictions (a tensor, .logits or a tuple starting with one), but it returned {_describe(out)}"
            )
        if cfg.loss == Loss.mse:
            return F.mse_loss(pred.float(), targets.float())
        return F.cross_entropy(pred.reshape(-1, pred.size(-1)).float(), targets.reshape(-1))

    return output if cfg.loss == Loss.output else predicted


def _meta_limit(exc: BaseException) -> bool:
    """An error of the meta device, not of the model (an op without a meta kernel, ``.item()``)."""
    return isinstance(exc, NotImplementedError) or "meta" in str(exc).lower()


def first_sample(batch: Batch) -> Batch:
    """The batch cut to its first row, for a check that needs no more."""
    if isinstance(batch, torch.Tensor):
        return batch[:1] if batch.dim() else batch
    if isinstance(batch, Mapping):
        return {k: first_sample(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return _same_kind(batch, [first_sample(v) for v in batch])
    return batch


def _counted_step(model: nn.Module, batch: Batch, loss_fn: LossFn, target: str, strict: bool) -> float | None:
    """FLOPs of one forward and backward; a failure is the model's (ContractError) unless it is
    the meta device's and ``strict`` is off (None)."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as counter:
            loss_fn(model, batch).backward()
    except ContractError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's forward: either meta's limit or their bug
        if is_oom(exc):
            raise  # too large for the device: the run's status is oom, not a bad config
        if not strict and _meta_limit(exc):
            # debug: the usual fallback (a check on real tensors follows), which read as an alarm, twice per sweep
            log.debug("model._target_=%s: not runnable on the meta device (%s)", target, exc)
            return None
        raise ContractError(
            f"invalid config: model._target_={target!r}: a training step on the first batch "
            f"({_describe(batch)}) raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    return float(counter.get_total_flops())


def meta_step(cfg: ModelConfig, batch: Batch, vocab_size: int | None, seq_len: int | None, ckpt: bool) -> float | None:
    """Build the model on the meta device and run one forward and backward on ``batch``: the
    contract checked without memory or kernels. Returns the step's FLOPs (FlopCounterMode; pass
    ``ckpt=False`` to count, so recomputation is not), or None where the meta device cannot run
    this model."""
    try:
        with torch.device("meta"):
            model = build_model(cfg, vocab_size, seq_len)
    except ContractError as exc:
        if exc.cause is not None and _meta_limit(exc.cause):  # e.g. an .item() while it initialises
            log.info("model._target_=%s: not buildable on the meta device (%s)", cfg._target_, exc.cause)
            return None
        raise
    model.train()
    if ckpt:
        apply_checkpointing(model, cfg)
    meta_batch = to_device(batch, "meta")
    units(meta_batch, cfg.unit)  # the batch itself is readable
    return _counted_step(model, meta_batch, loss_function(cfg), cfg._target_, strict=False)


def check(cfg: ModelConfig, batch: Batch, vocab_size: int | None, seq_len: int | None, ckpt: bool) -> None:
    """The contract, before any job: one step on the meta device, or where that cannot run this
    model and it is small enough (``names.CPU_CHECK_MAX_PARAMS``), one CPU step on one sample."""
    if meta_step(cfg, batch, vocab_size, seq_len, ckpt) is not None:
        return
    try:
        with torch.device("meta"):
            n_params = sum(p.numel() for p in build_model(cfg, vocab_size, seq_len).parameters())
    except ContractError:  # not buildable on meta: its size is unknown without building it for real
        n_params = None
    if n_params is None or n_params > CPU_CHECK_MAX_PARAMS:
        log.info("model._target_=%s: %s parameters, left to its first job to check", cfg._target_, n_params)
        return
    with torch.random.fork_rng(devices=[]):
        model = build_model(cfg, vocab_size, seq_len).train()
        if ckpt:
            apply_checkpointing(model, cfg)
        _counted_step(model, first_sample(batch), loss_function(cfg), cfg._target_, strict=True)


def count_flops(
    cfg: ModelConfig, raw: nn.Module, batch: Batch, vocab_size: int | None, seq_len: int | None
) -> float | None:
    """A step's training FLOPs for a model without a formula: on the meta device, or where that
    cannot run it, one real forward and backward of ``raw`` (before checkpointing and compile) on
    the first sample of the job's first batch, times the batch's samples (a sample's FLOPs do not
    depend on its batch), so counting needs a sample's memory, not a step's. Its gradients are
    then dropped, the device's cache emptied and the RNG state restored: the steps after it are
    those of a job that never counted."""
    flops = meta_step(cfg, batch, vocab_size, seq_len, ckpt=False)
    if flops is not None:
        return flops
    device = next((p.device for p in raw.parameters()), torch.device("cpu"))
    cuda = [device.index or 0] if device.type == "cuda" else []
    samples = units(batch, cfg.unit)[1]
    with torch.random.fork_rng(devices=cuda):
        one = _counted_step(raw, to_device(first_sample(batch), device), loss_function(cfg), cfg._target_, strict=True)
    raw.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return None if one is None else one * samples
