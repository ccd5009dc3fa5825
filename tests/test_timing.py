"""Warmup until steady, the measured window, and the timing modes (perfsweep.timing)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from perfsweep import corpus, metrics
from perfsweep.config import ConfigError, Device, PerfsweepConfig, StepsConfig, Timing
from perfsweep.metrics import StepRecord
from perfsweep.runner import train
from perfsweep.timing import measure, resolve_timing, warm_up
from tests.test_profiling import tiny_cfg


@dataclass
class ScriptedSteps:
    """Step times from a script, for the warmup rule alone (the real trainer is tested below)."""

    times: list[float]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    i: int = 0
    take_the_time: bool = False
    """Sleep each step's scripted milliseconds, for a wall time to measure."""

    def step(self) -> tuple[float, float, float]:
        t = self.times[min(self.i, len(self.times) - 1)]
        self.i += 1
        if self.take_the_time:
            time.sleep(t / 1000.0)
        return t, 0.0, 1.0

    def run(self) -> tuple[torch.Tensor, float]:
        raise AssertionError("sync timing never queues steps without waiting")


def test_warmup_goes_on_until_two_windows_agree():
    script = [900, 300, 200, 150, 120, 105, 101, 100, 100, 100, 100, 100]
    records: list[StepRecord] = []
    w = warm_up(ScriptedSteps(script), records, minimum=2, window=3, tolerance=0.02, cap=30, on_step=lambda r: None)
    # medians of the last two windows of 3: after 10 steps 100 vs 105 (4.8%, not yet);
    # after 11 steps 100 vs 101 (1%): steady
    assert (w.steps, w.steady_state) == (11, True)
    assert [r.phase for r in records] == ["warmup"] * 11 and [r.step for r in records] == list(range(11))
    assert metrics.steady([r.step_time_ms for r in records], 3, 0.02)


def test_warmup_stops_at_the_cap_unsettled_and_is_exact_without_the_check():
    drifting = [100 + 10 * i for i in range(50)]
    w = warm_up(ScriptedSteps(drifting), [], minimum=3, window=3, tolerance=0.02, cap=12, on_step=lambda r: None)
    assert (w.steps, w.steady_state) == (12, False)
    w = warm_up(ScriptedSteps(drifting), [], minimum=4, window=0, tolerance=0.02, cap=12, on_step=lambda r: None)
    assert (w.steps, w.steady_state) == (4, None)


def test_warmup_past_the_minimum_stops_at_the_time_budget():
    slow = [14_000.0 - 500 * i for i in range(30)]  # bf16 steps of model=small on a CPU without bf16 units, settling
    w = warm_up(ScriptedSteps(slow), [], 3, 3, 0.02, cap=20, on_step=lambda r: None, budget_s=30.0)
    assert (w.steps, w.steady_state) == (6, False)  # past the 3 minimum, steps start at 0, 12.5 and 24.5 s; none at 36
    w = warm_up(ScriptedSteps(slow), [], 3, 3, 0.02, cap=20, on_step=lambda r: None, budget_s=1.0)
    assert (w.steps, w.steady_state) == (4, False)  # the minimum always runs, and one step past it
    compiled = [70_000.0, 40.0, 25.0, 12.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]  # a 70 s compile in the first step
    w = warm_up(ScriptedSteps(compiled), [], 1, 3, 0.02, cap=20, on_step=lambda r: None, budget_s=30.0)
    assert (w.steps, w.steady_state) == (9, True)  # the compile is in the minimum: it does not use the budget
    with pytest.raises(ConfigError, match=r"steps.max_warmup_s=0: must be > 0 seconds or null"):
        StepsConfig(max_warmup_s=0)


def test_sync_window_wall_time_covers_its_steps():
    records: list[StepRecord] = []
    seen: list[StepRecord] = []
    t0 = time.perf_counter()
    wall = measure(ScriptedSteps([5.0], take_the_time=True), records, 4, "sync", seen.append)
    around = (time.perf_counter() - t0) * 1000.0
    assert [r.phase for r in records] == ["measure"] * 4 and seen == records
    assert 4 * 5.0 <= wall <= around  # the window's wall time, in ms: its 4 steps of 5 ms, and no more than elapsed


def test_timing_mode_resolution_and_validation():
    assert resolve_timing("auto", torch.device("cpu")) == "sync"
    assert resolve_timing("auto", torch.device("cuda", 0)) == "events"
    assert resolve_timing("sync", torch.device("cuda", 0)) == "sync"
    with pytest.raises(ConfigError, match=r"timing='events': needs CUDA"):
        PerfsweepConfig(device=Device.cpu, timing=Timing.events)
    with pytest.raises(ConfigError, match=r"steps.max_warmup=2: must be >= 6 \(steps.warmup=3, and two windows"):
        StepsConfig(warmup=3, max_warmup=2)
    # the cap: 20, or room for the minimum plus two windows; none without the check
    assert StepsConfig().warmup_cap == 20
    assert StepsConfig(warmup=25).warmup_cap == 31  # a long minimum warmup is not refused
    assert StepsConfig(warmup=25, stable_window=0).warmup_cap == 25
    assert StepsConfig(stable_window=15).warmup_cap == 33  # two windows of 15 fit
    with pytest.raises(ValueError, match="CUDA"):
        measure(ScriptedSteps([1.0]), [], 1, "events", lambda r: None)


def test_a_real_job_stores_where_measurement_began(tmp_path: Path):
    cfg = tiny_cfg(tmp_path)
    cfg.steps = StepsConfig(warmup=2, measure=5, stable_window=2, stable_tolerance=0.5, max_warmup=20)
    result = train(cfg, corpus.prepare(cfg.data), tmp_path / "job", "steady", str(tmp_path))
    phases = [s["phase"] for s in result["steps"]]
    warm = result["warmup_steps"]
    assert 4 <= warm <= 20 and phases[:warm] == ["warmup"] * warm  # two windows of 2 at least
    assert result["measure_start_step"] == warm and phases[warm : warm + 5] == ["measure"] * 5
    warm_times = [s["step_time_ms"] for s in result["steps"][:warm]]
    assert result["steady_state"] == metrics.steady(warm_times, 2, 0.5)
    assert result["timing_mode"] == "sync"  # CPU
    measured = [s["step_time_ms"] for s in result["steps"] if s["phase"] == "measure"]
    # the window's wall time holds its steps and little else; tokens/s is taken over it
    assert sum(measured) <= result["measure_wall_ms"] <= sum(measured) * 1.5 + 5
    assert result["tokens_per_s"] == pytest.approx(5 * cfg.batch * cfg.seq_len / (result["measure_wall_ms"] / 1000))


def test_a_job_marks_its_first_step_and_its_windows_end_in_order_on_the_shared_clock(tmp_path: Path):
    """What perfsweep.metrics.JobClock splits a job's time by: the job's own ``steps`` milestone
    before its first step is reported, and ``measured`` after its window's last step and before
    any step after the window (the memory step here, then the profiled window's), each read on
    the monotonic clock the sweep's process shares. Under ``timing=events`` (CUDA) a window's
    steps are reported after it, so a step's arrival could not have said when the first started."""
    from perfsweep.runner import Reporter

    class Recorded:
        """The job's end of the pipe, keeping what it was sent, and when."""

        def __init__(self) -> None:
            self.sent: list[tuple[float, tuple]] = []

        def send(self, message: tuple) -> None:
            self.sent.append((time.monotonic(), message))

    conn = Recorded()
    cfg = tiny_cfg(tmp_path)
    before = time.monotonic()
    train(cfg, corpus.prepare(cfg.data), tmp_path / "job", "marks", str(tmp_path), Reporter(conn))
    kinds = [m[1] for _, m in conn.sent]  # a step's phase, or a milestone's name
    assert kinds[0] == "steps" and kinds.count("steps") == kinds.count("measured") == 1, kinds
    last_measure = max(i for i, k in enumerate(kinds) if k == "measure")
    assert kinds[last_measure + 1] == "measured" and kinds[last_measure + 2 :].count("measure") == 0, kinds
    assert "memory" in kinds[last_measure + 2 :]  # the CPU's memory step comes after the window
    marks = {m[1]: m[2] for _, m in conn.sent if m[0] == "milestone"}
    sent_at = {m[1]: t for t, m in conn.sent if m[0] == "milestone"}
    assert before <= marks["steps"] <= sent_at["steps"] and marks["measured"] <= sent_at["measured"]
