"""A throwaway single-node SLURM cluster for the test session (real daemons, no mocks).

``slurm_cluster()`` makes a fresh temporary directory and runs, all from inside it:

* ``munged`` with its own key (``mungekey``, else 1 KiB from /dev/urandom, mode 0600) on a
  private socket, so it neither needs nor touches /etc/munge or /run/munge;
* ``slurmctld -D`` and ``slurmd -D`` (foreground, as children of this process) reading a
  generated ``slurm.conf``: this host as controller and as the one node (``CPUs`` =
  ``os.cpu_count()``, ``RealMemory`` a bit under the machine's), one default partition,
  free TCP ports, state/spool/pid/log files in the directory, munge auth through the private
  socket (``AuthInfo=socket=...``), and plugins that need neither cgroups nor systemd
  (``proctrack/linuxproc``, ``task/none``, ``jobacct_gather/none``, no accounting storage).

It waits (bounded) until ``sinfo`` shows the node idle, then yields a ``SlurmCluster``:
``env`` holds what a client needs (``SLURM_CONF``), ``client_env()`` is ``os.environ`` with
it applied, and ``run``/``sbatch``/``job``/``wait_job``/``scancel`` call the client commands
with that environment. On exit every job is cancelled, slurmd, slurmctld and munged are
stopped (SIGTERM, then SIGKILL), any process still carrying this cluster's ``SLURM_CONF``
(a ``slurmstepd`` or a job's processes, which outlive slurmd by design) is killed, and the
directory is deleted. Every wait and every subprocess call is bounded in time.

slurmd must run as root to start jobs, so the fixture skips unless the tests run as root.
No accounting storage is configured, so ``sacct`` does not work: ask ``scontrol show job``
(``SlurmCluster.job``), which keeps a finished job for ``MinJobAge`` (300 s).

The session-scoped fixture ``slurm_cluster`` wraps it and skips, with one reason, when the
binaries are absent (``apt-get install slurm-wlm munge``) or the tests do not run as root.
Load it with ``pytest_plugins = ["tests.slurm"]``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SKIP_REASON = "SLURM (slurm-wlm, munge) not installed: apt-get install slurm-wlm munge"
ROOT_REASON = "the SLURM test cluster needs root (slurmd must run as root to start jobs)"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo")  # srun: submitit runs jobs with it
PARTITION = "debug"
START_TIMEOUT_S = 60.0  # munged's socket, then the node idle in sinfo
STOP_TIMEOUT_S = 15.0  # each daemon, after SIGTERM, before SIGKILL
CMD_TIMEOUT_S = 30.0  # one client command (sbatch, squeue, ...)
KILL_WAIT_S = 5  # slurm.conf KillWait: SIGTERM to SIGKILL for a cancelled job


def find_binaries() -> dict[str, str] | None:
    """Paths of the daemons and client commands (PATH, then /usr/sbin); None if any is missing."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin", "/sbin"])
    found = {name: shutil.which(name, path=path) for name in (*DAEMONS, *CLIENTS)}
    if not all(found.values()):
        return None
    found["mungekey"] = shutil.which("mungekey", path=path)  # munge >= 0.5.14; else dd
    return found  # type: ignore[return-value]


def skip_reason() -> str | None:
    """Why the cluster cannot start here, or None."""
    if find_binaries() is None:
        return SKIP_REASON
    if os.geteuid() != 0:
        return ROOT_REASON
    return None


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _mem_total_mib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 1024


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _clean_env() -> dict[str, str]:
    """``os.environ`` without SLURM_* variables inherited from an enclosing job or cluster."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_", "SRUN_"))}


def _procs_with_env(key: str, value: str) -> list[int]:
    """Pids of processes (not this one) whose environment holds ``key=value``."""
    needle = f"{key}={value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # gone, or a kernel thread
            continue
    return pids


def _stat(pid: int) -> tuple[str, int]:
    """(state letter, parent pid) of a process; ("X", 0) when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return "X", 0


def _alive(pid: int) -> bool:
    return _stat(pid)[0] not in ("Z", "X")


@dataclass
class SlurmCluster:
    """A running cluster: its directory, config and the environment its clients need."""

    tmpdir: Path
    conf_path: Path
    node: str
    partition: str
    cpus: int
    env: dict[str, str]  # to add to a client's environment: {"SLURM_CONF": ...}
    logs: dict[str, Path] = field(default_factory=dict)

    def client_env(self, **extra: str) -> dict[str, str]:
        """A complete environment for a client (or a sweep that calls sbatch): os.environ, minus
        inherited SLURM_* variables, plus ``env`` and ``extra``."""
        return {**_clean_env(), **self.env, **extra}

    def run(
        self, *args: str, timeout: float = CMD_TIMEOUT_S, check: bool = True, cwd: str | Path | None = None
    ) -> subprocess.CompletedProcess:
        """Run a SLURM client command (``run("squeue", "-h")``) against this cluster."""
        proc = subprocess.run(
            list(args), env=self.client_env(), cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed, exit {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        return proc

    def sbatch(self, *args: str, cwd: str | Path | None = None) -> int:
        """Submit with ``sbatch --parsable ARGS``; return the job id."""
        out = self.run("sbatch", "--parsable", *args, cwd=cwd or self.tmpdir).stdout.strip()
        return int(out.split(";")[0])

    def scancel(self, *args: str) -> None:
        self.run("scancel", *args)

    def squeue(self) -> str:
        """``squeue`` lines ``JOBID STATE REASON`` of every job slurmctld still lists as pending/running."""
        return self.run("squeue", "-h", "-o", "%i %T %r").stdout

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, ExitCode, StdOut, ...); {} once slurmctld
        has forgotten the job (MinJobAge after it ended)."""
        proc = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if proc.returncode != 0:
            return {}
        fields: dict[str, str] = {}
        for token in proc.stdout.split():
            key, sep, value = token.partition("=")
            if sep:
                fields[key] = value
        return fields

    def wait_job(self, job_id: int, states: Sequence[str] | None = None, timeout: float = 60.0) -> dict[str, str]:
        """Wait until the job's JobState is one of ``states`` (default: any terminal state);
        return its ``scontrol show job`` fields. TimeoutError with the last state otherwise."""
        terminal = states or ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in terminal:
                return info
            time.sleep(0.25)
        raise TimeoutError(f"job {job_id} not in {list(terminal)} after {timeout:.0f}s: {info.get('JobState')}")


def _write_conf(root: Path, host: str, sock: Path, ctld_port: int, slurmd_port: int) -> Path:
    cpus = os.cpu_count() or 1
    mem = max(256, int(_mem_total_mib() * 0.9))  # under the machine's, or slurmd's registration drains the node
    for sub in ("state", "spool"):
        (root / sub).mkdir(mode=0o755)
    (root / "plugstack.conf").write_text("")  # not /etc/slurm's: PlugStackConfig defaults to the conf's dir
    conf = root / "slurm.conf"
    conf.write_text(
        f"""# perfsweep test cluster (tests/slurm.py)
ClusterName=perfsweeptest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
KillWait={KILL_WAIT_S}
InactiveLimit=0
MinJobAge=300
SlurmdTimeout=300
NodeName={host} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={cpus} RealMemory={mem} State=UNKNOWN
PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
    )
    return conf


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)


def _kill_leftovers(conf: Path) -> list[int]:
    """SIGKILL every process still carrying this cluster's SLURM_CONF (slurmstepd, job tasks);
    return the pids that survived 10 s."""
    deadline = time.monotonic() + 10
    pids = _procs_with_env("SLURM_CONF", str(conf))
    while pids and time.monotonic() < deadline:
        for pid in pids:
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        pids = [p for p in _procs_with_env("SLURM_CONF", str(conf)) if _alive(p)]
    return pids


@contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start a throwaway single-node SLURM cluster (with its own munged); yield it; stop it all."""
    bins = find_binaries()
    if bins is None:
        raise FileNotFoundError(SKIP_REASON)
    if os.geteuid() != 0:
        raise PermissionError(ROOT_REASON)
    host = socket.gethostname().split(".")[0]
    root = Path(tempfile.mkdtemp(prefix="perfsweep-slurm-"))
    os.chmod(root, 0o700)  # munged refuses group/world-writable key, socket and log directories
    key, sock = root / "munge.key", root / "munge.socket"
    logs = {f"{name}{ext}": root / f"{name}{ext}" for name in DAEMONS for ext in (".log", ".out")}  # .out: stdout
    procs: dict[str, subprocess.Popen] = {}
    conf = None

    def fail(what: str) -> RuntimeError:
        detail = "\n".join(f"--- {path.name} ---\n{_tail(path)}" for path in logs.values() if path.exists())
        return RuntimeError(f"SLURM test cluster: {what}\n{detail}")

    def daemon(name: str, cmd: list[str], env: dict[str, str]) -> None:
        with open(root / f"{name}.out", "wb") as out:  # the foreground daemon's stdout/stderr
            procs[name] = subprocess.Popen(
                cmd,
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    try:
        if bins["mungekey"]:
            subprocess.run([bins["mungekey"], "-c", "-k", str(key)], check=True, capture_output=True, timeout=30)
        else:
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        daemon(
            "munged",
            [
                bins["munged"],
                "--foreground",
                "--force",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={root / 'munged.pid'}",
                f"--log-file={logs['munged.log']}",
                f"--seed-file={root / 'munged.seed'}",
                "--num-threads=2",
            ],
            _clean_env(),
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not sock.exists():
            if procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise fail(f"munged did not start (exit {procs['munged'].poll()})")
            time.sleep(0.05)

        ctld_port, slurmd_port = _free_ports(2)
        conf = _write_conf(root, host, sock, ctld_port, slurmd_port)
        env = {**_clean_env(), "SLURM_CONF": str(conf)}
        daemon("slurmctld", [bins["slurmctld"], "-D", "-f", str(conf)], env)
        daemon("slurmd", [bins["slurmd"], "-D", "-f", str(conf)], env)
        cluster = SlurmCluster(
            tmpdir=root,
            conf_path=conf,
            node=host,
            partition=PARTITION,
            cpus=os.cpu_count() or 1,
            env={"SLURM_CONF": str(conf)},
            logs=logs,
        )
        state = ""
        while True:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise fail(f"{name} exited with {proc.returncode} while starting")
            probe = cluster.run("sinfo", "-h", "-N", "-o", "%T", check=False, timeout=10)
            state = probe.stdout.strip() or probe.stderr.strip()
            if probe.returncode == 0 and state == "idle":
                break
            if time.monotonic() > deadline:
                raise fail(f"node {host} not idle after {START_TIMEOUT_S:.0f}s (sinfo: {state!r})")
            time.sleep(0.2)
        yield cluster
    finally:
        try:
            if conf is not None and "slurmctld" in procs and procs["slurmctld"].poll() is None:
                env = {**_clean_env(), "SLURM_CONF": str(conf)}
                with suppress(subprocess.TimeoutExpired, OSError):  # every job: SIGTERM now, SIGKILL after KillWait
                    subprocess.run(
                        [bins["scancel"], "--full", "-p", PARTITION], env=env, capture_output=True, timeout=10
                    )
                    drain_by = time.monotonic() + KILL_WAIT_S + 10
                    while time.monotonic() < drain_by:
                        q = subprocess.run([bins["squeue"], "-h"], env=env, capture_output=True, text=True, timeout=10)
                        if q.returncode != 0 or not q.stdout.strip():
                            break
                        time.sleep(0.25)
                    daemons = {p.pid for p in procs.values()}  # and their helpers (slurmctld's slurmscriptd)
                    while time.monotonic() < drain_by:  # slurmstepd and the tasks exit a moment after squeue
                        pids = _procs_with_env("SLURM_CONF", str(conf))
                        if not [p for p in pids if p not in daemons and _stat(p)[1] not in daemons and _alive(p)]:
                            break
                        time.sleep(0.1)
            for name in ("slurmd", "slurmctld", "munged"):
                _stop(procs.get(name))
            if conf is not None:
                survivors = _kill_leftovers(conf)
                if survivors:
                    raise RuntimeError(f"SLURM test cluster: processes {survivors} survived SIGKILL")
        finally:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", name="slurm_cluster")
def slurm_cluster_fixture() -> Iterator[SlurmCluster]:
    """A single-node SLURM cluster started for this test session (the fixture ``slurm_cluster``)."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with slurm_cluster() as cluster:
        yield cluster
