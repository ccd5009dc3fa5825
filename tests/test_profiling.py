"""The profiled window, run for real in this process on a tiny model."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from perfsweep import corpus
from perfsweep.config import (
    DataConfig,
    DataKind,
    Device,
    ModelConfig,
    PerfsweepConfig,
    ProfileConfig,
    StepsConfig,
)
from perfsweep.profiling import STAGES
from perfsweep.runner import train

TINY_MODEL = ModelConfig(
    name="tiny", ckpt_modules=["Block"], args=dict(n_layers=2, n_heads=2, d_model=32, d_ff=64, max_seq_len=64)
)


def tiny_cfg(tmp_path: Path, **kw) -> PerfsweepConfig:
    return PerfsweepConfig(
        batch=2,
        seq_len=16,
        model=TINY_MODEL,
        device=Device.cpu,  # asserts CPU semantics
        data=DataConfig(
            name="syn",
            kind=DataKind.synthetic,
            synthetic_vocab=64,
            synthetic_tokens=5000,
            vocab_limit=None,
            cache_dir=str(tmp_path / "cache"),
        ),
        steps=StepsConfig(warmup=1, measure=3),
        **kw,
    )


@pytest.fixture
def profiled(tmp_path: Path):
    cfg = tiny_cfg(tmp_path, profile=ProfileConfig(wait=1, warmup=1, active=2, top_n=7))
    td = corpus.prepare(cfg.data)
    return train(cfg, td, tmp_path / "job", "amp=false,ckpt=false", str(tmp_path)), cfg


def test_trace_has_stage_names_and_profiler_steps(profiled):
    result, _ = profiled
    traces = [a for a in result["artifacts"] if a["kind"] == "trace"]
    assert len(traces) == 1
    path = Path(traces[0]["path"])
    assert path.name == "trace_amp=false,ckpt=false.json.gz" and path.stat().st_size == traces[0]["bytes"]
    trace = json.loads(gzip.decompress(path.read_bytes()))
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert set(STAGES) <= names
    steps = sorted(n for n in names if n.startswith("ProfilerStep#"))
    assert len(steps) == 2  # the two active steps
    table = next(a for a in result["artifacts"] if a["kind"] == "profiler_table")
    assert "Self CPU" in Path(table["path"]).read_text()


def test_the_trace_carries_the_measured_step_its_busy_share_is_taken_of(profiled):
    """The job writes its measured (unprofiled) step median into its trace, so ``perfsweep trace``
    on it takes the busy share of the step the run stored, not of the profiler-slowed one."""
    from perfsweep.trace import PERFSWEEP_TRACE_INFO, analyze

    result, _ = profiled
    trace_path = next(Path(a["path"]) for a in result["artifacts"] if a["kind"] == "trace")
    info = json.loads(gzip.decompress(trace_path.read_bytes()))[PERFSWEEP_TRACE_INFO]
    assert info == {"measured_step_ms": pytest.approx(result["step_time_ms_median"])}
    a = analyze(trace_path, require_gpu=False)
    assert a.basis_ms() == (pytest.approx(result["step_time_ms_median"]), "measured_step_ms_in_trace")
    assert a.basis_ms(5.0) == (5.0, "measured_step_ms")  # --step-ms still wins


def test_stage_and_op_tables(profiled):
    result, cfg = profiled
    stages = {s["stage"]: s for s in result["stages"]}
    assert set(stages) == set(STAGES)
    for s in stages.values():
        assert s["calls"] == 2  # once per active step
        assert s["cpu_time_ms"] > 0
        assert s["device_time_source"] == "same_as_cpu" and s["device_time_ms"] == s["cpu_time_ms"]
    # each stage's time per step is what the exported trace says, read here without perfsweep's
    # parser: the record_function ranges' durations (us) summed over the active steps
    trace_path = next(Path(a["path"]) for a in result["artifacts"] if a["kind"] == "trace")
    events = json.loads(gzip.decompress(trace_path.read_bytes()))["traceEvents"]
    for name, row in stages.items():
        durations = [e["dur"] for e in events if e.get("name") == name and e.get("ph") == "X"]
        assert len(durations) == 2
        assert row["cpu_time_ms"] == pytest.approx(sum(durations) / 1000.0 / 2, abs=1e-5)  # 10 ns: float rounding
    ops = result["ops"]
    assert 0 < len(ops) <= 7 and {o["sort_by"] for o in ops} == {"self_cpu"}
    assert [o["rank"] for o in ops] == list(range(1, len(ops) + 1))
    assert ops == sorted(ops, key=lambda o: -o["self_cpu_ms"])
    assert not any(o["name"] in STAGES or o["name"].startswith("ProfilerStep") for o in ops)
    # which ops make the top 7 of a tiny model is up to the machine's noise; the matmuls that do carry FLOPs
    assert all(o["flops"] for o in ops if o["name"] in ("aten::mm", "aten::addmm"))


def test_matmuls_are_in_the_op_table_with_their_flops(tmp_path: Path):
    """With room for every op, the model's matmuls are there and carry the FLOPs the profiler counted."""
    cfg = tiny_cfg(tmp_path, profile=ProfileConfig(wait=1, warmup=1, active=2, top_n=500))
    ops = train(cfg, corpus.prepare(cfg.data), tmp_path / "job", "amp=false,ckpt=false", str(tmp_path))["ops"]
    assert len(ops) < 500  # every op of the window, not a cut
    matmuls = [o for o in ops if o["name"] in ("aten::mm", "aten::addmm")]
    assert matmuls and all(o["flops"] > 0 for o in matmuls)


def test_profiled_steps_are_not_measured_steps(profiled):
    result, cfg = profiled
    phases = [s["phase"] for s in result["steps"]]
    warm = result["warmup_steps"]  # at least steps.warmup=1, more until steady
    assert warm >= 2 * cfg.steps.stable_window
    assert phases == ["warmup"] * warm + ["measure"] * 3 + ["memory"] + ["profile"] * 4
    assert result["measure_steps"] == 3


def test_profile_disabled_writes_no_trace(tmp_path: Path):
    cfg = tiny_cfg(tmp_path, profile=ProfileConfig(enabled=False))
    result = train(cfg, corpus.prepare(cfg.data), tmp_path / "job", "x", str(tmp_path))
    assert result["stages"] == [] and result["ops"] == [] and result["artifacts"] == []
    assert [s["phase"] for s in result["steps"]].count("profile") == 0
    assert result["peak_allocated_bytes"] > 0  # the CPU memory step runs without the window


def test_compile_diagnostics(tmp_path: Path):
    cfg = tiny_cfg(tmp_path, compile=True, compile_backend="aot_eager", profile=ProfileConfig(enabled=False))
    result = train(cfg, corpus.prepare(cfg.data), tmp_path / "job", "compile=true", str(tmp_path))
    # our GPT compiles whole: one graph, no break, and fixed shapes never recompile
    assert (result["n_graphs"], result["n_graph_breaks"], result["n_recompiles"]) == (1, 0, 0)
    assert result["graph_break_reasons"] is None
    measured = sorted(s["step_time_ms"] for s in result["steps"] if s["phase"] == "measure")
    assert result["compile_time_ms"] == pytest.approx(result["steps"][0]["step_time_ms"] - measured[1])
    assert result["compile_time_ms"] > 0  # the first step compiled: it cost more than a steady one


def test_compile_counters_see_breaks_and_recompiles():
    """The diagnostics count what Dynamo did, checked on functions with a known break and recompile."""
    import torch
    from torch._dynamo.utils import counters, guard_failures

    from perfsweep import compile as compile_mod

    def fresh() -> None:  # a job process starts with empty counters; this test shares its process
        torch._dynamo.reset()
        counters.clear()
        guard_failures.clear()

    fresh()

    def whole(x):
        return x * 2 + 1

    fn = torch.compile(whole, backend="eager")
    fn(torch.ones(3))
    fn(torch.ones(3))  # same guards: no recompile
    assert {k: compile_mod.diagnostics()[k] for k in ("n_graphs", "n_graph_breaks", "n_recompiles")} == {
        "n_graphs": 1,
        "n_graph_breaks": 0,
        "n_recompiles": 0,
    }
    fn(torch.ones(3, dtype=torch.float64))  # a dtype guard fails: one recompilation
    assert compile_mod.diagnostics()["n_recompiles"] == 1

    fresh()

    def broken(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    torch.compile(broken, backend="eager")(torch.ones(3))
    d = compile_mod.diagnostics()
    assert d["n_graph_breaks"] == 1 and d["n_graphs"] == 2  # one graph on each side of the break
    # torch's wording: "graph_break()" (2.13), "skip function graph_break in file ..." (2.6)
    assert "graph_break" in next(iter(d["graph_break_reasons"]))
    fresh()


def test_tensorboard_trace_handler(tmp_path: Path):
    cfg = tiny_cfg(tmp_path, profile=ProfileConfig(wait=0, warmup=1, active=1, tensorboard=True))
    result = train(cfg, corpus.prepare(cfg.data), tmp_path / "job", "tb", str(tmp_path))
    tb = [a for a in result["artifacts"] if a["kind"] == "tensorboard_trace"]
    assert len(tb) == 1 and tb[0]["path"].endswith(".pt.trace.json") and tb[0]["bytes"] > 0
    assert any(a["kind"] == "trace" for a in result["artifacts"])  # the .json.gz is still written


def test_only_profiled_steps_enter_the_stage_labels(tmp_path: Path):
    """Timed steps run unlabelled (a record_function range costs ~8 us even with no profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from perfsweep.runner import build

    cfg = tiny_cfg(tmp_path)
    trainer, _ = build(cfg, torch.device("cpu"), corpus.prepare(cfg.data))
    seen = {}
    for labelled in (False, True):
        trainer.labelled = labelled
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            trainer.step()
        seen[labelled] = {e.key for e in prof.key_averages()} & set(STAGES)
    assert seen == {False: set(), True: set(STAGES)}


def test_operator_calls_and_flops_per_step_match_the_model(tmp_path: Path):
    """With two profiled steps, per-step columns are half the window totals, and the matmul
    FLOPs of one step are exactly 6 x (Linear weights) x tokens: 2 forward, 4 backward."""
    import torch

    cfg = tiny_cfg(tmp_path, profile=ProfileConfig(wait=0, warmup=1, active=2, top_n=200))
    result = train(cfg, corpus.prepare(cfg.data), tmp_path / "job", "ops", str(tmp_path))
    ops = {o["name"]: o for o in result["ops"] if o["sort_by"] == "self_cpu"}
    for o in ops.values():
        assert o["calls_per_step"] == o["calls"] / 2
        assert (o["flops_per_step"] is None) == (o["flops"] is None)
    assert ops["aten::embedding"]["calls_per_step"] == 2  # token and position tables, once each
    from perfsweep.model import GPT

    model = GPT(cfg.model.gpt, 64)  # the vocabulary of tiny_cfg's synthetic data
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    matmul = sum(ops[k]["flops_per_step"] for k in ("aten::mm", "aten::addmm") if k in ops)
    assert matmul == 6 * linear_weights * cfg.batch * cfg.seq_len
