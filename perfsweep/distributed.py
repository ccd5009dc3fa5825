"""Data-parallel jobs (``nproc`` set): one grid point trained by N ranks with DistributedDataParallel.

The job process becomes the ranks' agent: it starts them through torch.distributed's elastic
launch API (``torch.distributed.launcher.api.elastic_launch``, what ``torchrun`` runs), on this
machine, with no restarts: a benchmark measures a job that ran once. NCCL on CUDA (rank r drives
``cuda:r`` of the job's visible GPUs), gloo on CPU (rank r pinned to its share of the job's cores).

Each rank runs perfsweep's own training path (perfsweep.runner.train) with three additions made
here: the model wrapped in DDP, a warmup that ends on the same step on every rank (else one rank
would wait in an allreduce the others never start), and the measured steps gathered after the
window, so the job's step times are the slowest rank's at each step and its throughput is the
global batch over them (perfsweep.metrics.slowest_rank_steps). Rank 0's result is the run's row.

The ranks run perfsweep.runner.rank_main (this module imports nothing of the runner: the runner
imports it). A rank that fails writes its classified outcome, with the time, to
``rank<r>.error.json`` in the job folder and exits; the agent then stops the other ranks, and the
run fails (or is ``oom``) with the error of the rank that failed first.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from perfsweep import envinfo, slots
from perfsweep.config import PerfsweepConfig

log = logging.getLogger(__name__)

ERROR_FILE = "rank{rank}.error.json"


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` in DDP when this process is a rank; gradients as views into DDP's buckets, so
    the buckets add no copy of the gradients to the job's memory."""
    if not active():
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)


def all_agree(done: bool, device: torch.device) -> bool:
    """True once every rank says ``done`` (a MIN allreduce; the one rank's flag elsewhere)."""
    if not active():
        return done
    flag = torch.tensor([1 if done else 0], dtype=torch.int32, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (``[obj]`` in a single-process job)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def init_rank(cpus: list[int] | None, on_cuda: bool) -> int:
    """In a rank the agent started (RANK, LOCAL_RANK, WORLD_SIZE and MASTER_* set): pin it to its
    share of the job's cores, select its GPU, join the process group (NCCL on CUDA, else gloo).
    Returns the rank."""
    r, local, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    _die_with_parent()
    share = len(cpus) // world if cpus else 0
    if share:  # the job's cores, split evenly: each rank its own (fewer cores than ranks: shared)
        os.sched_setaffinity(0, cpus[local * share : (local + 1) * share])
    if on_cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if on_cuda else "gloo")
    return r


def _die_with_parent() -> None:
    """Linux: the kernel kills this rank when its job process dies, even by SIGKILL (perfsweep's
    timeout), so a rank stuck in a collective cannot outlive its job and hold the GPUs of the slot
    the next job is given."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux/glibc: the agent's own shutdown is all there is
        pass


def rank_folder(job_dir: str | Path, r: int) -> Path:
    """Where rank ``r`` writes (traces, compile cache): the job folder for rank 0, else a folder in it."""
    return Path(job_dir) if r == 0 else Path(job_dir) / f"rank{r}"


def write_failure(job_dir: str | Path, r: int, status: str, message: str, tb: str, partial: dict[str, Any]) -> None:
    """A failing rank's outcome, for :func:`run` to report (the agent only knows its exit code)."""
    plain = {k: v for k, v in partial.items() if isinstance(v, (str, int, float, bool, type(None)))}
    error = {"rank": r, "status": status, "message": f"rank {r}: {message}", "traceback": tb, "partial": plain}
    error["time"] = time.time()  # which rank failed first: the others often fail because it did
    (Path(job_dir) / ERROR_FILE.format(rank=r)).write_text(json.dumps(error))


class RankFailed(Exception):
    """A rank of a data-parallel job failed; ``status``, ``partial`` and ``tb`` are that rank's."""

    def __init__(self, message: str, status: str, partial: dict[str, Any], tb: str) -> None:
        super().__init__(message)
        self.status, self.partial, self.tb = status, partial, tb


def run(
    entrypoint: Callable[..., dict[str, Any] | None],
    cfg: PerfsweepConfig,
    token_data: Any,
    job_dir: Path,
    label: str,
    launch_dir: str,
    conn: Any,
) -> dict[str, Any]:
    """Train the grid point on ``cfg.nproc`` ranks, each running ``entrypoint`` (perfsweep.runner.
    rank_main) with the job's arguments; rank 0's result, with every rank's steps folded in (see
    the module docstring). Raises :class:`RankFailed` with the first failed rank's outcome."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from perfsweep.config import to_plain_dict

    for stale in job_dir.glob(ERROR_FILE.format(rank="*")):
        stale.unlink()
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=cfg.nproc,
        run_id=f"perfsweep-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",  # a free port on this machine, as torchrun --standalone
        max_restarts=0,
        monitor_interval=0.2,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(job_dir / "ranks")),
        **_keep_ignored(LaunchConfig),
    )
    affinity = slots.allowed_cpus()  # the ranks split these: within the cgroup's CPU quota too
    kills_before = envinfo.oom_kills()  # a rank killed by SIGKILL: was it the kernel's OOM killer?
    try:
        results = elastic_launch(config, entrypoint)(
            to_plain_dict(cfg), token_data, str(job_dir), label, launch_dir, affinity, conn
        )
    except ChildFailedError as exc:
        raise _first_failure(job_dir, exc, kills_before) from None
    # the row is the job's: the cores the job had (its ranks split them; torch_threads is a rank's)
    return {**results[0], **slots.cpu_share()}


def _keep_ignored(launch_config: type) -> dict[str, str]:
    """LaunchConfig's ``signals_to_handle`` less the signals this job ignores (a sweep started with
    a script's ``&`` ignores SIGINT and SIGQUIT, ``nohup`` SIGHUP; perfsweep.interrupts keeps them
    so): the agent otherwise handles each as its SignalException, and its ranks, spawned under that
    handler, take the default, so a Ctrl-C meant for the terminal's foreground command stopped the
    job. Kept ignored, the ranks inherit them ignored too. Nothing where torch's LaunchConfig has
    no such field (2.6 and 2.8 do not; 2.13 does): its agent handles them whatever it is told."""
    field = getattr(launch_config, "__dataclass_fields__", {}).get("signals_to_handle")
    if field is None:
        return {}
    handled = [s.strip() for s in field.default.split(",")]
    ignored = {s for s in handled if hasattr(signal, s) and signal.getsignal(getattr(signal, s)) is signal.SIG_IGN}
    ignored.discard("SIGTERM")  # the sweep stops a job with it: its agent must then stop the ranks
    return {"signals_to_handle": ",".join(s for s in handled if s not in ignored)} if ignored else {}


def _first_failure(job_dir: Path, exc: Any, kills_before: int | None = None) -> RankFailed:
    """The outcome of the rank that failed first. A rank killed by a signal (SIGKILL: a user, the
    kernel's OOM killer) writes nothing, and the others then fail in their collectives and write
    that (``Connection reset by peer``), so the killed rank is named, as a job process killed so
    is (:func:`perfsweep.envinfo.sigkill_outcome`). Else the rank that wrote its error first:
    when one rank raises, the others' collectives fail at once too, and the agent names only the
    first dead process it finds in rank order. SIGTERM is the agent's own stop of the others."""
    written = [json.loads(p.read_text()) for p in job_dir.glob(ERROR_FILE.format(rank="*"))]
    wrote = {e.get("rank") for e in written}
    for r, failure in sorted(exc.failures.items()):
        if failure.exitcode < 0 and r not in wrote and -failure.exitcode != signal.SIGTERM:
            if -failure.exitcode == signal.SIGKILL:
                status, message, _ = envinfo.sigkill_outcome(f"rank {r}", kills_before, envinfo.oom_kills())
            else:
                status, message = "failed", f"rank {r} died (signal {failure.signal_name()}) without reporting an error"
            return RankFailed(message, status, {}, "")
    if written:
        e = min(written, key=lambda e: e.get("time", float("inf")))
        return RankFailed(e["message"], e["status"], e["partial"], e["traceback"])
    r, failure = next(iter(exc.failures.items()))
    how = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
    return RankFailed(f"rank {r} died ({how}) without reporting an error", "failed", {}, "")
