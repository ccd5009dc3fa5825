"""Training batches: the built-in corpora's tokens (perfsweep.corpus) served in windows, or a
user's Dataset or DataLoader factory (``data._target_``, :func:`loader`).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from perfsweep.config import DataConfig
from perfsweep.corpus import TokenData


class TokenWindows(Dataset):
    """Non-overlapping windows of seq_len+1 tokens: inputs are the first seq_len, targets the last."""

    def __init__(self, tokens_path: Path, seq_len: int) -> None:
        self.tokens_path = tokens_path
        self.seq_len = seq_len
        self._tokens: np.ndarray | None = None  # opened lazily, once per DataLoader worker
        n = int(np.load(tokens_path, mmap_mode="r").shape[0])
        self.n_windows = (n - 1) // seq_len
        if self.n_windows < 1:
            raise ValueError(f"seq_len={seq_len}: corpus has only {n} tokens; use a shorter seq_len or more data")

    def __len__(self) -> int:
        return self.n_windows

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tokens is None:
            self._tokens = np.load(self.tokens_path, mmap_mode="r")
        start = i * self.seq_len
        chunk = torch.from_numpy(self._tokens[start : start + self.seq_len + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


def make_loader(data: TokenData, seq_len: int, batch: int, workers: int, seed: int, pin_memory: bool) -> DataLoader:
    ds = TokenWindows(data.tokens_path, seq_len)
    if len(ds) < batch:
        raise ValueError(
            f"batch={batch}: corpus has only {len(ds)} windows of seq_len={seq_len}; lower batch or seq_len"
        )
    return batched(ds, batch, workers, seed, pin_memory)


def batched(ds: Dataset, batch: int, workers: int, seed: int, pin_memory: bool) -> DataLoader:
    """Every map-style dataset's loader, ours or a user's: shuffled by ``seed`` (the same order in
    every config of a sweep), whole batches only, persistent workers so no epoch restarts them."""
    return DataLoader(
        ds,
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=ignore_hangup if workers > 0 else None,
    )


def ignore_hangup(_worker_id: int) -> None:
    """A DataLoader worker's start: a closed terminal's SIGHUP reaches the workers too, and its
    default killed them under the job ("DataLoader worker killed by signal: Hangup"), their
    semaphores left in /dev/shm. Ignored, the job shuts them down as it unwinds
    (perfsweep.interrupts.unwind_on_hangup), as torch's own workers do for Ctrl-C."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def loader(
    cfg: DataConfig,
    token_data: TokenData | None,
    batch: int,
    seq_len: int | None,
    workers: int,
    seed: int,
    pin_memory: bool,
) -> Iterable[Any]:
    """A job's batches: token windows for the built-in corpora, else the ``data._target_``
    factory's. A Dataset it returns is batched here, so ``batch``, ``workers``, pinned memory and
    the seeded shuffle apply as for token data; a DataLoader (or any iterable) is used as it is."""
    if cfg._target_ is None:
        assert token_data is not None and seq_len is not None
        return make_loader(token_data, seq_len, batch, workers, seed, pin_memory)
    from perfsweep.task import ContractError, call_factory

    offered = {"batch": batch, "seq_len": seq_len, "seed": seed, "workers": workers, "pin_memory": pin_memory}
    made = call_factory("data", cfg._target_, cfg.args, offered)
    if isinstance(made, Iterator):
        raise ContractError(
            f"invalid config: data._target_={cfg._target_!r}: returned a one-shot {type(made).__name__}, which "
            "ends after one pass; return a Dataset, an IterableDataset or a DataLoader (iterated once per epoch)"
        )
    if isinstance(made, IterableDataset):  # whole batches only: a short last one would count as a full one
        return DataLoader(
            made,
            batch_size=batch,
            drop_last=True,
            num_workers=workers,
            pin_memory=pin_memory,
            worker_init_fn=ignore_hangup if workers > 0 else None,
        )
    if not isinstance(made, Dataset) and isinstance(made, Iterable) and not isinstance(made, (str, bytes)):
        return made  # a DataLoader, or any iterable of batches
    if not isinstance(made, Dataset):
        raise ContractError(
            f"invalid config: data._target_={cfg._target_!r}: returned {type(made).__name__}, "
            "expected a torch Dataset, IterableDataset or DataLoader"
        )
    try:
        n = len(made)  # type: ignore[arg-type]
    except TypeError:
        raise ContractError(
            f"invalid config: data._target_={cfg._target_!r}: returned a {type(made).__name__} without __len__; "
            "a map-style Dataset needs one (a stream is an IterableDataset)"
        ) from None
    if n < batch:
        raise ContractError(
            f"invalid config: batch={batch}: data._target_={cfg._target_!r} holds {n} samples, fewer than one batch"
        )
    return batched(made, batch, workers, seed, pin_memory)


def infinite(loader: Iterable[Any]):
    """Cycle through epochs; the sweep's step count, not the corpus size, decides when to stop."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the data yields no batch (an empty dataset, or drop_last with fewer samples than batch)")
