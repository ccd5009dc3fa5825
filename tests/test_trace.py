"""The trace analysis against real H100 traces (trimmed copies in tests/fixtures/h100).

Expected figures are the shared H100 README's table "GPU time per stage, computed from the
traces" (measured 2026-11-22, perfsweep 6f6ede7, torch 2.11.0+cu130); the measured step times
come from the database the same sweeps wrote. What perfsweep stored at the time for backward
was 0.0 ms in every GPU run.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from perfsweep import store
from perfsweep.metrics import bottleneck_verdict
from perfsweep.names import BOTTLENECK_RULE, KERNEL_CATEGORIES, STAGES
from perfsweep.trace import TraceError, analyze, kernel_category, main

H100 = Path(__file__).parent / "fixtures" / "h100"

# trace -> (data_to_device, forward, backward, optimizer_step, GPU busy) ms per step, README table
README_MS = {
    "minigpt_seed_fp16_amp0_ckpt0": (0.00, 12.91, 26.73, 1.01, 40.7),
    "minigpt_seed_fp16_amp0_ckpt1": (0.00, 12.99, 38.80, 1.01, 52.8),
    "minigpt_seed_fp16_amp1_ckpt0": (0.00, 2.43, 4.65, 1.46, 8.5),
    "minigpt_seed_fp16_amp1_ckpt1": (0.00, 2.45, 6.79, 1.46, 10.7),
    "gpt2_small_bf16_compile_b16_t1024": (0.02, 14.86, 34.13, 1.75, 50.8),
}
# trace -> (runs.id in the fixture database, README busy share)
README_BUSY_SHARE = {
    "minigpt_seed_fp16_amp0_ckpt0": (4, 0.95),
    "minigpt_seed_fp16_amp0_ckpt1": (3, 0.94),
    "minigpt_seed_fp16_amp1_ckpt0": (2, 0.36),
    "minigpt_seed_fp16_amp1_ckpt1": (1, 0.16),
    "gpt2_small_bf16_compile_b16_t1024": (6, 0.96),
}


def trace_path(name: str) -> Path:
    return H100 / f"{name}.trace.json.gz"


def measured_step_ms(run_id: int) -> float:
    con = sqlite3.connect(f"file:{H100 / 'results-fp16-seed-snapshot-gpt2.db'}?immutable=1", uri=True)
    try:
        return con.execute("SELECT step_time_ms_median FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
    finally:
        con.close()


def close(got: float, want: float, rel: float = 0.02) -> bool:
    """Within ``rel`` of a README figure, allowing for its rounding to the printed digits."""
    return abs(got - want) <= max(rel * abs(want), 0.006)


@pytest.mark.parametrize("name", sorted(README_MS))
def test_stage_gpu_times_reproduce_the_h100_readme(name):
    a = analyze(trace_path(name))
    d2d, fwd, bwd, opt, busy = README_MS[name]
    assert a.steps == 2 and a.step_markers and a.device_name == "NVIDIA H100 80GB HBM3"
    got = a.stage_gpu_ms
    for stage, want in zip(
        ("data_to_device", "forward", "backward", "optimizer_step"), (d2d, fwd, bwd, opt), strict=True
    ):
        assert close(got[stage], want), (stage, got[stage], want)
    assert close(a.gpu_busy_ms, busy, rel=0.01)
    assert got["backward"] > got["forward"] > 0  # the old attribution stored backward = 0.0
    # every kernel of the steps has a stage: nothing falls between the ranges
    assert a.unattributed_gpu_ms < 0.01
    assert sum(got.values()) + a.unattributed_gpu_ms == pytest.approx(a.gpu_kernel_ms)
    # a union is never above the sum of its parts: built from the traces' absolute timestamps
    # (about 1e12 us) it came out 4e-6 ms above it here, 9e-6 ms in amp1_ckpt0; test_gpu's same
    # check failed on an H200 (2026-11-28). One stream: the two are equal to a double's rounding
    # (the compiled GPT-2's kernels overlap by 0.002 ms a step)
    assert a.gpu_busy_ms <= a.gpu_kernel_ms * (1 + 1e-12)
    assert a.gpu_busy_ms == pytest.approx(a.gpu_kernel_ms, rel=1e-3 if "compile" in name else 1e-12)


@pytest.mark.parametrize("name", sorted(README_BUSY_SHARE))
def test_busy_share_and_verdict_from_the_measured_step(name):
    run_id, share = README_BUSY_SHARE[name]
    step_ms = measured_step_ms(run_id)
    a = analyze(trace_path(name))
    assert abs(a.busy_fraction(step_ms) - share) <= 0.02
    verdict = bottleneck_verdict(a.gpu_busy_ms, step_ms, data_wait_fraction=0.01)
    assert verdict.gpu_busy_fraction == pytest.approx(a.busy_fraction(step_ms))
    # MiniGPT with AMP at batch 2 is launch bound; fp32 and the compiled GPT-2 keep the GPU busy
    assert verdict.bottleneck == ("host" if "amp1" in name else "gpu")
    assert verdict.bottleneck_rule == BOTTLENECK_RULE


def test_verdict_rules():
    assert bottleneck_verdict(5.0, 10.0, 0.25).bottleneck == "data"  # data wait dominates
    assert bottleneck_verdict(7.0, 10.0, 0.0).bottleneck == "gpu"
    assert bottleneck_verdict(6.9, 10.0, None).bottleneck == "host"
    assert set(bottleneck_verdict(None, 10.0, 0.5).row().values()) == {None}  # CPU: never guessed


def test_kernel_categories_on_real_kernels():
    a = analyze(trace_path("minigpt_seed_fp16_amp0_ckpt0"))
    cats = a.categories
    assert set(cats) <= set(KERNEL_CATEGORIES)
    assert sum(c.ms_per_step for c in cats.values()) == pytest.approx(a.gpu_kernel_ms)
    assert max(cats, key=lambda c: cats[c].ms_per_step) == "gemm"  # fp32 sgemm dominates
    assert cats["attention"].ms_per_step > 5  # fmha_cutlassF/B, not counted as CUTLASS GEMMs
    assert cats["optimizer"].ms_per_step == pytest.approx(a.stage_gpu_ms["optimizer_step"], rel=0.05)
    assert "other" not in cats or cats["other"].ms_per_step < 0.05 * a.gpu_kernel_ms
    assert [k.ms_per_step for k in a.top_kernels] == sorted((k.ms_per_step for k in a.top_kernels), reverse=True)


@pytest.mark.parametrize(
    ("name", "event_cat", "category"),
    [
        ("nvjet_sm90_hsh_96x128_64x6_2x1_v_bz_NNN", "kernel", "gemm"),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(Params)", "kernel", "gemm"),
        ("fmha_cutlassB_f32_aligned_128x64_k65536_dropout_sm80", "kernel", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", "kernel", "attention"),
        ("triton_tem_fused_addmm_0", "kernel", "gemm"),
        (
            "triton_red_fused__log_softmax__to_copy__unsafe_view_mm_prepare_softmax_online_view_19",
            "kernel",
            "reduction",
        ),
        ("triton_poi_fused__log_softmax__log_softmax_backward_data_mm_nll_loss_backward", "kernel", "elementwise/norm"),
        # a norm kernel is a norm kernel, eager or fused by Inductor (its prefix says reduction)
        ("triton_per_fused__to_copy_add_native_layer_norm_backward_view_6", "kernel", "elementwise/norm"),
        ("triton_red_fused__to_copy_sum_view_7", "kernel", "reduction"),  # by prefix
        ("void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 4, 4, false>", "kernel", "gemm"),
        (
            "void at::native::vectorized_layer_norm_kernel<float, float, false>(int, float)",
            "kernel",
            "elementwise/norm",
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
            "kernel",
            "optimizer",
        ),
        ("void at::native::reduce_kernel<128, 4, ReduceOp<{lambda()#1}>>", "kernel", "reduction"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", "kernel", "communication"),
        ("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", "memcpy/memset"),
        ("Memset (Device)", "gpu_memset", "memcpy/memset"),
        ("my_custom_kernel", "kernel", "other"),
        # a sort is no reduction; cub's reduce and scan kernels are
        (
            "void cub::CUB_200200_800_900_NS::DeviceRadixSortOnesweepKernel<Policy900, false, long, long>",
            "kernel",
            "other",
        ),
        ("void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long>", "kernel", "other"),
        ("void cub::CUB_200200_800_900_NS::DeviceReduceSingleTileKernel<Policy600, float*>", "kernel", "reduction"),
        ("void cub::CUB_200200_800_900_NS::DeviceScanKernel<Policy900, long*, long*>", "kernel", "reduction"),
    ],
)
def test_kernel_name_rules(name, event_cat, category):
    assert kernel_category(name, event_cat) == category


def _write(path: Path, events: list[dict], **meta) -> Path:
    path.write_text(json.dumps({"traceEvents": events, **meta}))
    return path


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: object) -> dict:
    """One complete ('X') Chrome-trace event, as torch.profiler writes them."""
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid} | (
        {"args": args} if args else {}
    )


def test_busy_time_is_the_union_of_overlapping_streams(tmp_path):
    """Two streams overlapping by 5 us: kernel time 30 us, busy time 25 us; a launch on another thread."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "forward", "ts": 1, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "backward", "ts": 20, "dur": 30, "pid": 1, "tid": 1},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 2,
            "dur": 1,
            "pid": 1,
            "tid": 1,
            "args": {"correlation": 1},
        },
        # launched from autograd's thread (tid 2) inside the main thread's backward range
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 25,
            "dur": 1,
            "pid": 1,
            "tid": 2,
            "args": {"correlation": 2},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm_a",
            "ts": 30,
            "dur": 15,
            "pid": 0,
            "tid": 7,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "elementwise_b",
            "ts": 40,
            "dur": 15,
            "pid": 0,
            "tid": 8,
            "args": {"correlation": 2},
        },
    ]
    a = analyze(_write(tmp_path / "t.json", ev))
    assert a.steps == 1 and a.step_markers
    assert a.gpu_kernel_ms == pytest.approx(0.030) and a.gpu_busy_ms == pytest.approx(0.025)
    assert a.stage_gpu_ms["forward"] == pytest.approx(0.015)  # ran during backward, launched in forward
    assert a.stage_gpu_ms["backward"] == pytest.approx(0.015)
    assert a.stage_cpu_ms == {"forward": pytest.approx(0.010), "backward": pytest.approx(0.030)}


def test_collective_time_from_communication_kernels_else_gloo_ranges(tmp_path):
    """DDP's allreduce: NCCL kernels overlapping each other count once; a CPU (gloo) trace has no
    kernels, and its ``gloo:all_reduce`` ranges on gloo's threads count instead; none: None."""

    step = _x("user_annotation", "ProfilerStep#3", 0, 1000)
    nccl = [
        step,
        _x("cuda_runtime", "cudaLaunchKernel", 10, 1, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 20, 1, correlation=2),
        _x(
            "kernel",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            100,
            300,
            9,
            correlation=1,
        ),
        _x(
            "kernel",
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            300,
            200,
            9,
            correlation=2,
        ),
        _x("user_annotation", "nccl:all_reduce", 15, 5, tid=1),  # the host's enqueue: not the GPU's time
    ]
    a = analyze(_write(tmp_path / "nccl.json", nccl))
    assert a.categories["communication"].kernels_per_step == 2
    assert a.collective_ms == pytest.approx(0.400)  # 100-500 us: the overlap counts once
    gloo = [
        step,
        _x("user_annotation", "gloo:all_reduce", 50, 120, tid=5),
        _x("user_annotation", "gloo:all_reduce", 400, 80, tid=6),
    ]
    gloo.append(_x("cpu_op", "c10d::allreduce_", 40, 3))
    gloo.append(_x("user_annotation", "gloo:all_reduce", 1500, 90, tid=5))  # after the profiled step
    b = analyze(_write(tmp_path / "gloo.json", gloo), require_gpu=False)
    assert b.collective_ms == pytest.approx(0.200)
    assert analyze(_write(tmp_path / "none.json", [step]), require_gpu=False).collective_ms is None


def test_cli_json_and_custom_stages(capsys):
    path = trace_path("minigpt_seed_fp16_amp1_ckpt0")
    assert main([str(path), "--json", "--step-ms", "23.94", "--stages", "forward,backward", "--top", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["stage_gpu_ms"]) == {"forward", "backward"}
    assert abs(out["stage_gpu_ms"]["backward"] - 4.65) < 0.01
    assert abs(out["gpu_busy_fraction"] - 0.36) <= 0.02 and out["gpu_busy_fraction_basis"] == "measured_step_ms"
    assert abs(out["gpu_busy_ms_per_step"] - 8.5) < 0.05
    assert set(out["kernel_categories"]) <= set(KERNEL_CATEGORIES) and len(out["top_kernels"]) == 3
    # optimizer kernels now fall outside the named stages
    assert out["unattributed_gpu_ms"] == pytest.approx(1.46, abs=0.02)


def test_cli_table_through_the_console_script(tmp_path):
    """The path users run: the perfsweep console script, on a job folder holding one trace."""
    job = tmp_path / "0_amp=true,ckpt=true"
    job.mkdir()
    shutil.copy(trace_path("minigpt_seed_fp16_amp1_ckpt1"), job / "trace_amp=true,ckpt=true.json.gz")
    exe = Path(sys.executable).with_name("perfsweep")
    proc = subprocess.run(
        [str(exe), "trace", str(job), "--step-ms", "68.35"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    backward = next(line for line in lines if line.startswith("backward"))
    assert backward.split()[1] == "6.79"
    assert any(line.startswith("GPU busy 10.70 ms per step = 16% of the measured step 68.35 ms") for line in lines)
    assert any(line.startswith("gemm") for line in lines)


def _cpu_trace(tmp_path: Path) -> Path:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function("forward"):
        torch.ones(64, 64) @ torch.ones(64, 64)
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    return path


def _bad_input(case: str, tmp_path: Path) -> Path:
    if case == "missing":
        return tmp_path / "nope.json"
    if case == "not_json":
        path = tmp_path / "notes.json.gz"
        path.write_bytes(gzip.compress(b"this is not json"))
        return path
    if case == "not_a_trace":
        path = tmp_path / "rows.json"
        path.write_text('{"rows": [1, 2]}')
        return path
    if case == "truncated_gzip":
        path = tmp_path / "cut.json.gz"
        path.write_bytes(trace_path("minigpt_seed_fp16_amp1_ckpt0").read_bytes()[:20_000])
        return path
    if case == "corrupt_gzip":  # damaged in the middle: zlib's own error, not gzip's OSError
        data = bytearray(trace_path("minigpt_seed_fp16_amp1_ckpt0").read_bytes())
        data[2000:2100] = bytes(100)
        path = tmp_path / "damaged.json.gz"
        path.write_bytes(bytes(data))
        return path
    if case == "deep_nesting":
        path = tmp_path / "deep.json"
        path.write_text("[" * 100_000 + "]" * 100_000)
        return path
    if case == "cpu_only":
        return _cpu_trace(tmp_path)
    return tmp_path  # a folder without a trace


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "not_json",
        "not_a_trace",
        "truncated_gzip",
        "corrupt_gzip",
        "deep_nesting",
        "cpu_only",
        "empty_folder",
    ],
)
def test_cli_bad_input_one_line_exit_2(case, tmp_path, capsys):
    path = _bad_input(case, tmp_path)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("perfsweep trace: ") and str(path) in err
    with pytest.raises(TraceError):
        analyze(path)


def test_h100_database_upgrades_without_losing_rows(tmp_path):
    """A database written by the H100 run (schema 0001) opens at head; old rows keep their values."""
    db = tmp_path / "results.db"
    shutil.copy(H100 / "results-fp16-seed-snapshot-gpt2.db", db)
    con = sqlite3.connect(db)
    before = con.execute("SELECT id, tokens_per_s, step_time_ms_median FROM runs ORDER BY id").fetchall()
    stages_before = con.execute("SELECT COUNT(*) FROM stages").fetchone()[0]
    con.close()
    engine = store.connect(f"sqlite:///{db}")
    try:
        assert "kernels" in inspect(engine).get_table_names()
        with engine.connect() as conn:
            after = conn.execute(text("SELECT id, tokens_per_s, step_time_ms_median FROM runs ORDER BY id")).all()
            assert [tuple(r) for r in after] == before and len(before) == 6
            assert conn.execute(text("SELECT COUNT(*) FROM stages")).scalar() == stages_before
            # old GPU rows get no verdict: their stages lack backward time, nothing is guessed
            assert conn.execute(text("SELECT COUNT(*) FROM runs WHERE bottleneck IS NOT NULL")).scalar() == 0
    finally:
        engine.dispose()


def test_stage_names_are_one_vocabulary():
    from perfsweep import profiling

    assert profiling.STAGES is STAGES


def test_malformed_events_do_not_crash(tmp_path):
    """Null names and unhashable correlation ids are skipped over, not a traceback; so are events
    whose process, thread or category is a list (they are counted as left out)."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": None, "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 1,
            "dur": 1,
            "pid": 1,
            "tid": 1,
            "args": {"correlation": [1]},
        },
        {"ph": "X", "cat": "kernel", "name": None, "ts": 2, "dur": 3, "pid": 0, "tid": 7, "args": {"correlation": [1]}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 1, "pid": [0], "tid": 7},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 5, "dur": 1, "pid": 1, "tid": [1]},
        {"ph": "X", "cat": ["kernel"], "name": "k", "ts": 5, "dur": 1, "pid": 0, "tid": 7},
    ]
    a = analyze(_write(tmp_path / "odd.json", ev))
    assert a.gpu_kernel_ms == pytest.approx(0.003) and a.unattributed_gpu_ms == pytest.approx(0.003)
    assert a.skipped_events == 3


@pytest.mark.parametrize(
    "argv",
    [["--step-ms", "nan"], ["--step-ms", "inf"], ["--step-ms", "0"], ["--step-ms", "1e-300"], ["--step-ms", "1e308"]]
    + [["--top", "-1"], ["--stages", ","], ["--bogus"]],
)
def test_cli_usage_mistakes_get_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([str(trace_path("minigpt_seed_fp16_amp1_ckpt0")), *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("perfsweep trace: ")


def test_an_empty_profiler_step_is_no_step(tmp_path):
    """A loop that ends before the profiler's schedule does leaves a ProfilerStep# range after its
    last prof.step() holding nothing: it divided every per-step figure (2 steps read as 3, -33%).
    First a real torch.profiler trace (CPU), then a GPU one whose last kernel runs in that range."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    path = tmp_path / "cpu.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=3),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(3):  # one warmup step and 2 active ones: the schedule wanted 3
            with record_function("forward"):
                torch.ones(64, 64) @ torch.ones(64, 64)
            prof.step()
    ranges = [e for e in json.loads(path.read_text())["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#")]
    assert len(ranges) == 3  # what torch wrote: the third range is the empty one
    a = analyze(path, require_gpu=False)
    assert (a.steps, a.empty_steps, a.stage_calls["forward"]) == (2, 1, 2)
    # with Python stacks the profiler's own exit leaves python_function frames in that range
    stacked = tmp_path / "stacked.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=3),
        with_stack=True,
        on_trace_ready=lambda p: p.export_chrome_trace(str(stacked)),
    ) as prof:
        for _ in range(3):
            with record_function("forward"):
                torch.ones(64, 64) @ torch.ones(64, 64)
            prof.step()
    a = analyze(stacked, require_gpu=False)
    assert (a.steps, a.empty_steps, a.stage_calls["forward"]) == (2, 1, 2)

    ev = [
        _x("user_annotation", "ProfilerStep#1", 0, 100),
        _x("user_annotation", "forward", 1, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=1),
        _x("kernel", "gemm_a", 30, 20, tid=7, correlation=1, device=0),
        _x("user_annotation", "ProfilerStep#2", 110, 100),
        _x("user_annotation", "forward", 111, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 112, 1, correlation=2),
        _x("kernel", "gemm_a", 200, 20, tid=7, correlation=2, device=0),  # runs on into the empty range
        _x("user_annotation", "ProfilerStep#3", 215, 7),
    ]
    a = analyze(_write(tmp_path / "gpu.json", ev))
    assert (a.steps, a.empty_steps) == (2, 1)
    assert a.stage_gpu_ms["forward"] == pytest.approx(0.020) and a.gpu_busy_ms == pytest.approx(0.020)
    assert a.step_wall_ms == pytest.approx(0.100)
    assert main([str(tmp_path / "gpu.json"), "--stages", "forward"]) == 0


def test_several_gpus_are_analysed_one_at_a_time(tmp_path, capsys):
    """GPU 0 busy 0-500 us, GPU 1 busy 500-1000 us: each is 50% busy. Their union read as one
    GPU 100% busy, on the first device's name; now the trace must say which GPU."""
    ev = [
        _x("user_annotation", "ProfilerStep#0", 0, 1000),
        _x("user_annotation", "forward", 0, 900),
        _x("cuda_runtime", "cudaLaunchKernel", 1, 1, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=2),
        _x("kernel", "gemm_a", 0, 500, tid=7, correlation=1, device=0),
        _x("kernel", "gemm_b", 500, 500, tid=7, correlation=2, device=1),
    ]
    props = [{"id": 0, "name": "GPU zero"}, {"id": 1, "name": "GPU one"}]
    path = _write(tmp_path / "two.json", ev, deviceProperties=props)
    with pytest.raises(TraceError, match="devices 0, 1; pass --device N"):
        analyze(path)
    one = analyze(path, device=1)
    assert (one.device, one.device_name) == (1, "GPU one")
    assert one.gpu_busy_ms == pytest.approx(0.5) and one.busy_fraction() == pytest.approx(0.5)
    assert one.stage_gpu_ms["forward"] == pytest.approx(0.5) and [k.name for k in one.top_kernels] == ["gemm_b"]
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device" in err
    assert main([str(path), "--json", "--device", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["device"], out["device_name"], out["gpu_busy_ms_per_step"]) == (0, "GPU zero", pytest.approx(0.5))
    assert main([str(path), "--device", "3"]) == 2
    assert "no GPU work on it; this trace has work on device(s) 0, 1" in capsys.readouterr().err
    # a device written as a digit string is that index; an event naming none (a memset) goes
    # with the GPU analysed: one GPU, not "devices 0, 0", nor a second GPU 0 beside GPU 1
    ev[5]["args"]["device"] = "1"
    ev.append(_x("gpu_memset", "Memset (Device)", 1000, 50, tid=7, correlation=3))
    ev.append(_x("cuda_runtime", "cudaMemsetAsync", 3, 1, correlation=3))
    del ev[4]  # GPU 1's kernel named by a string, and the memset naming none
    one = analyze(_write(tmp_path / "one.json", ev))
    assert one.device == 1 and one.gpu_busy_ms == pytest.approx(0.550)


def test_events_without_a_usable_time_are_left_out_and_counted(tmp_path, capsys):
    """A negative duration gave negative stage and busy times; it is left out, and said so."""
    ev = [
        _x("user_annotation", "ProfilerStep#0", 0, 100),
        _x("user_annotation", "forward", 0, 50),
        _x("cuda_runtime", "cudaLaunchKernel", 1, 1, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=2),
        _x("kernel", "gemm_a", 10, 30, tid=7, correlation=1),
        _x("kernel", "gemm_b", 50, -100, tid=7, correlation=2),
    ]
    path = _write(tmp_path / "neg.json", ev)
    a = analyze(path)
    assert a.skipped_events == 1
    assert a.stage_gpu_ms["forward"] == pytest.approx(0.030) and a.gpu_busy_ms == pytest.approx(0.030)
    assert main([str(path), "--stages", "forward"]) == 0
    assert "1 event(s) without a usable time" in capsys.readouterr().err


def test_a_step_without_length_gives_no_share_and_strict_json(tmp_path, capsys):
    """Every event at one instant: the share is unknown (JSON null), not NaN, which strict JSON
    parsers refuse, nor 'nan%' in the table."""
    ev = [
        _x("user_annotation", "forward", 5, 0),
        _x("cuda_runtime", "cudaLaunchKernel", 5, 0, correlation=1),
        _x("kernel", "gemm_a", 5, 0, tid=7, correlation=1),
    ]
    path = _write(tmp_path / "instant.json", ev)
    assert main([str(path), "--json", "--stages", "forward"]) == 0

    def refuse(token: str) -> None:
        raise AssertionError(f"not strict JSON: {token}")

    out = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert out["gpu_busy_fraction"] is None
    assert main([str(path), "--stages", "forward"]) == 0
    assert "share unknown" in capsys.readouterr().out


def test_a_launch_belongs_to_its_own_threads_stage_and_nested_ranges_count_once(tmp_path):
    """Two threads' stages overlap: a launch inside thread 1's forward is forward's, though
    thread 2's later-starting backward also spans it (autograd's thread, with no stage of its
    own, still finds the main thread's). A forward nested in a forward is one call of its length."""
    ev = [
        _x("user_annotation", "ProfilerStep#0", 0, 1000),
        _x("user_annotation", "forward", 0, 100, tid=1),
        _x("user_annotation", "forward", 10, 30, tid=1),  # nested: a recursive record_function
        _x("user_annotation", "backward", 50, 100, tid=2),
        _x("cuda_runtime", "cudaLaunchKernel", 60, 1, tid=1, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 120, 1, tid=3, correlation=2),  # autograd's thread
        _x("kernel", "gemm_a", 200, 10, tid=7, correlation=1),
        _x("kernel", "gemm_b", 220, 20, tid=7, correlation=2),
    ]
    a = analyze(_write(tmp_path / "threads.json", ev))
    assert a.stage_gpu_ms["forward"] == pytest.approx(0.010) and a.stage_gpu_ms["backward"] == pytest.approx(0.020)
    assert a.stage_cpu_ms["forward"] == pytest.approx(0.100) and a.stage_calls["forward"] == 1
    # two calls whose edges overlap by a rounding: two calls, and their time counted once
    edges = [
        _x("user_annotation", "ProfilerStep#0", 0, 1000),
        _x("user_annotation", "forward", 0, 100.0000001),
        _x("user_annotation", "forward", 100, 100),
    ]
    b = analyze(_write(tmp_path / "edges.json", edges), require_gpu=False)
    assert b.stage_calls["forward"] == 2 and b.stage_cpu_ms["forward"] == pytest.approx(0.200)


def test_a_stage_name_missing_from_the_trace_is_named(capsys):
    """Some of the ranges named, not all: GPU time reading 0 for a stage must not pass unsaid."""
    path = trace_path("minigpt_seed_fp16_amp1_ckpt0")
    assert main([str(path), "--stages", "forward,backward,optimizer"]) == 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no range named optimizer" in err
    assert main([str(path)]) == 0
    assert capsys.readouterr().err == ""  # perfsweep's own trace holds every stage


def test_a_perfsweep_trace_gives_the_stored_busy_share_without_step_ms(tmp_path, capsys):
    """The H100 trace as perfsweep now writes it, with the job's measured step inside: the share is
    the README's (36%) with no --step-ms, where the profiler-slowed step gave 18%."""
    from perfsweep.trace import PERFSWEEP_TRACE_INFO

    name = "minigpt_seed_fp16_amp1_ckpt0"
    run_id, share = README_BUSY_SHARE[name]
    trace = json.loads(gzip.decompress(trace_path(name).read_bytes()))
    assert main([str(trace_path(name)), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["gpu_busy_fraction_basis"] == "profiled_step_wall_ms" and before["gpu_busy_fraction"] < share - 0.1
    trace[PERFSWEEP_TRACE_INFO] = {"measured_step_ms": measured_step_ms(run_id)}
    path = tmp_path / "with_info.json.gz"
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    assert main([str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu_busy_fraction_basis"] == "measured_step_ms_in_trace"
    assert abs(out["gpu_busy_fraction"] - share) <= 0.02 and out["measured_step_ms"] == measured_step_ms(run_id)
    assert main([str(path)]) == 0
    assert "36% of the measured step 23.94 ms (the job's, in the trace)" in capsys.readouterr().out


def test_a_step_shorter_than_the_busy_time_is_questioned(capsys):
    """--step-ms 1 on a trace busy 8.53 ms per step printed 853% and nothing else."""
    path = trace_path("minigpt_seed_fp16_amp1_ckpt0")
    assert main([str(path), "--step-ms", "1"]) == 0
    captured = capsys.readouterr()
    assert "853% of the measured step 1.00 ms" in captured.out
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "longer than the 1.00 ms step" in err and "--step-ms" in err
    assert main([str(path), "--step-ms", "23.94"]) == 0
    assert capsys.readouterr().err == ""


def test_a_busy_time_past_the_profiled_step_asks_for_the_measured_one(tmp_path, capsys):
    """No --step-ms and no measured step in the trace: the share is the profiled step's, and a
    kernel that runs on past the host's step (launched at its end) made it 250%. The warning asked
    "is the step this trace's step time?", of a step the user never gave (a review found it)."""
    ev = [
        _x("user_annotation", "ProfilerStep#1", 0, 100),
        _x("user_annotation", "forward", 10, 80),
        _x("cuda_runtime", "cudaLaunchKernel", 85, 1, correlation=1),
        {**_x("kernel", "gemm_a", 90, 250, correlation=1), "pid": 0, "tid": 7},
    ]
    assert main([str(_write(tmp_path / "late.json", ev)), "--stages", "forward"]) == 0
    err = capsys.readouterr().err.strip()
    assert err == (
        "perfsweep trace: the GPU is busy 0.25 ms per step, longer than the 0.10 ms step its share is taken of "
        "(250%); the kernels ran on past the end of the host's profiled steps; give the measured step time with "
        "--step-ms"
    )


def test_a_trace_merged_from_two_processes_is_read_one_process_at_a_time(tmp_path, capsys):
    """Two ranks' traces in one file (the H100 trace twice: the second process's host events under
    another pid, its GPU work on device 1): each GPU gets its own process's steps and launches, and
    its figures are the single trace's. Counted together, the two processes' ProfilerStep ranges
    made 4 steps of 2 and halved every figure. Where the processes' correlation ids collide (each
    process numbers its own from the start), no kernel can be matched to its launch: one line, exit 2."""
    name = "minigpt_seed_fp16_amp1_ckpt0"
    with gzip.open(trace_path(name), "rt") as fh:
        data = json.load(fh)
    single = analyze(trace_path(name))
    gpu_cats = ("kernel", "gpu_memcpy", "gpu_memset")

    def merged(offset: int) -> Path:
        second = []
        for e in json.loads(json.dumps(data["traceEvents"])):
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            if e.get("cat") in gpu_cats:
                e["pid"], args["device"] = 1, 1
            elif isinstance(e.get("pid"), int):
                e["pid"] += 100_000
            if isinstance(args.get("correlation"), int):
                args["correlation"] += offset
            second.append(e)
        return _write(
            tmp_path / f"merged_{offset}.json",
            data["traceEvents"] + second,
            **{k: v for k, v in data.items() if k != "traceEvents"},
        )

    apart = merged(offset=10**7)  # a merge that kept the ids apart
    for device in (0, 1):
        a = analyze(apart, device=device)
        assert (a.steps, a.device) == (single.steps, device) == (2, device)
        assert a.stage_gpu_ms == pytest.approx(single.stage_gpu_ms)
        assert a.stage_cpu_ms == pytest.approx(single.stage_cpu_ms)
        assert (a.gpu_busy_ms, a.step_wall_ms) == (
            pytest.approx(single.gpu_busy_ms),
            pytest.approx(single.step_wall_ms),
        )
        assert a.unattributed_gpu_ms == pytest.approx(single.unattributed_gpu_ms)
        assert (a.host_pid, single.host_pid) == (504 + 100_000 * device, None)
    assert main([str(apart), "--device", "1"]) == 0
    assert "(device 1), launched by process 100504 of several in the trace" in capsys.readouterr().out
    colliding = merged(offset=0)
    assert main([str(colliding), "--device", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "events of 2 processes (pids 100504, 504)" in err[0], err
    assert "share correlation ids" in err[0] and "analyse each process's own trace" in err[0]
    # two processes' launches on one GPU, ids apart: whose steps the GPU's time is shared over is unknown
    ev = [
        _x("user_annotation", "ProfilerStep#0", 0, 100),
        _x("cuda_runtime", "cudaLaunchKernel", 1, 1, correlation=1),
        _x("kernel", "gemm_a", 2, 10, tid=7, correlation=1, device=0),
        _x("kernel", "gemm_b", 20, 10, tid=7, correlation=2, device=0),
    ]
    ev.append(_x("user_annotation", "ProfilerStep#0", 0, 100) | {"pid": 2})
    ev.append(_x("cuda_runtime", "cudaLaunchKernel", 3, 1, correlation=2) | {"pid": 2})
    with pytest.raises(
        TraceError,
        match=r"events of 2 processes \(pids 1, 2\), and device 0's kernels were launched by pids 1, 2; analyse",
    ):
        analyze(_write(tmp_path / "shared_gpu.json", ev))


def test_top_0_leaves_the_kernel_list_out_header_and_all(capsys):
    """--top 0 asks for no top kernels: the table ended in a 'top kernels' header over nothing."""
    path = trace_path("minigpt_seed_fp16_amp1_ckpt0")
    assert main([str(path), "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert "top kernels" not in out and out.rstrip().splitlines()[-1].split()[0] in KERNEL_CATEGORIES, out
    assert main([str(path), "--top", "2"]) == 0
    assert capsys.readouterr().out.count("\n") == out.count("\n") + 4  # a blank line, the header, two kernels
