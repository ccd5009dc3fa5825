"""The bottleneck verdict, summary and GPU chart on the H100 minigpt_seed sweep (tests/h100.py).

The shared H100 README's point: with AMP at batch 2 the GPU is busy 36% of the step (16% with
checkpointing), which is why AMP's ~4.8x smaller GPU work gives only ~1.8x the tokens/s. These
tests check that the summary, the report table and the GPU chart say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perfsweep import store, summary
from perfsweep.names import STAGES
from perfsweep.report.build import make_report, results_table
from tests.h100 import build_h100_db


@pytest.fixture(scope="module")
def h100_engine(tmp_path_factory: pytest.TempPathFactory):
    url = build_h100_db(tmp_path_factory.mktemp("h100") / "results.db")
    engine = store.connect(url)
    yield engine
    engine.dispose()


def test_summary_prints_busy_share_and_verdict(h100_engine):
    df = summary.summary_frame(h100_engine, 1)
    text = summary.format_summary(df)
    header, *lines = text.splitlines()[: len(df) + 1]  # the notes follow the table
    assert "GPU busy" in header and "bound by" in header
    by_cfg = {(int(r.amp), int(r.ckpt)): line for r, line in zip(df.itertuples(), lines, strict=True)}
    assert "36%" in by_cfg[(1, 0)] and by_cfg[(1, 0)].rstrip().endswith("host")
    assert "16%" in by_cfg[(1, 1)] and "host" in by_cfg[(1, 1)]
    assert "95%" in by_cfg[(0, 0)] and "gpu" in by_cfg[(0, 0)]


def test_mfu_an_older_perfsweep_stored_is_marked_as_over_the_bf16_peak(tmp_path: Path):
    """These H100 rows' MFU was taken over the bf16 peak whatever the dtype (migration 0004 kept it,
    with no peak): the fp32 baseline's 32 TFLOP/s read '3.2%' beside the AMP runs' figures, where
    over its own fp32 peak it is about 48%. Marked '* of bf16' with the note, in the summary and the
    report; a run whose peak is stored reads as a share of its own dtype's peak, unmarked."""
    from perfsweep.configs import OLD_MFU_NOTE

    engine = store.connect(build_h100_db(tmp_path / "results.db"))
    try:
        with engine.connect() as conn:
            (tflops, mfu, peak) = conn.exec_driver_sql(
                "SELECT model_tflops_per_s, mfu, mfu_peak_flops FROM runs WHERE amp = 0 AND ckpt = 0"
            ).one()
        assert peak is None and mfu == pytest.approx(tflops * 1e12 / 989e12)  # the bf16 peak, for an fp32 run
        text = summary.format_summary(summary.summary_frame(engine, 1))
        table, note = results_table(make_report(engine, [1]).configs)
        for shown in (text, table):
            assert f"{mfu:.1%} of bf16*" in shown and shown.count("of bf16*") == 4, shown
        assert OLD_MFU_NOTE in text and OLD_MFU_NOTE in note
        with engine.begin() as conn:  # as perfsweep stores it now: the fp32 peak it was taken over
            conn.exec_driver_sql(
                "UPDATE runs SET mfu = model_tflops_per_s * 1e12 / 67e12, mfu_peak_flops = 67e12, "
                "mfu_compute_dtype = 'fp32' WHERE amp = 0"
            )
            conn.exec_driver_sql("UPDATE runs SET mfu_peak_flops = 989e12, mfu_compute_dtype = 'bf16' WHERE amp = 1")
        text = summary.format_summary(summary.summary_frame(engine, 1))
        table, note = results_table(make_report(engine, [1]).configs)
        for shown in (text, table):
            assert f"{tflops * 1e12 / 67e12:.1%}" in shown and "*" not in shown.split("\n")[0]
            assert "of bf16*" not in shown and OLD_MFU_NOTE not in shown
        assert f"{tflops * 1e12 / 67e12:.1%} of fp32" in table and OLD_MFU_NOTE not in note
    finally:
        engine.dispose()


def test_gpu_chart_shows_why_amp_gains_less_than_its_gpu_work(h100_engine, tmp_path: Path):
    rep = make_report(h100_engine, [1])
    chart = rep.charts["gpu"]
    assert chart.skipped is None and chart.figure is not None
    f = chart.frame.set_index("label")
    amp, fp32 = f.loc["amp=on ckpt=off"], f.loc["amp=off ckpt=off"]
    kernel_cols = [c for c in f.columns if c.startswith("kernel_ms_")]
    work = f[kernel_cols].sum(axis=1)
    # GPU work shrinks ~4.8x, tokens/s grows only ~1.8x: the GPU idles, host-bound
    assert work["amp=off ckpt=off"] / work["amp=on ckpt=off"] == pytest.approx(4.8, abs=0.15)
    assert amp["tokens_per_s"] / fp32["tokens_per_s"] == pytest.approx(1.78, abs=0.02)
    assert (amp["bottleneck"], fp32["bottleneck"]) == ("host", "gpu")
    assert amp["gpu_busy_fraction"] == pytest.approx(0.36, abs=0.02)
    # drawn: the middle panel's bars are the busy shares in percent
    _, ax_busy, ax_kernels = chart.figure.axes[:3]
    busy = [p.get_width() for p in ax_busy.patches]  # one bar per config, in the frame's order
    assert busy == pytest.approx([100 * v for v in chart.frame["gpu_busy_fraction"]])
    assert len(ax_kernels.patches) == len(f) * len(kernel_cols)  # one stacked segment per category
    # each segment is the stored GPU time of its category (ms per profiled step), in category order
    with h100_engine.connect() as conn:
        stored = dict(
            ((r, c), ms) for r, c, ms in conn.exec_driver_sql("SELECT run_id, category, ms_per_step FROM kernels")
        )
    ids = chart.frame["id"].tolist()
    expected = [stored.get((i, c.removeprefix("kernel_ms_")), 0.0) for c in kernel_cols for i in ids]
    assert [p.get_width() for p in ax_kernels.patches] == pytest.approx(expected)
    table, _ = results_table(rep.configs)
    assert "| GPU busy | bottleneck |" in table and "| 36% | host |" in table


def test_breakdown_draws_the_stored_cpu_and_gpu_stage_times(h100_engine, tmp_path: Path):
    rep = make_report(h100_engine, [1])
    chart = rep.charts["breakdown"]
    ax_cpu, ax_gpu = chart.figure.axes[:2]  # CUDA runs: CPU time and GPU kernel time side by side
    with h100_engine.connect() as conn:
        stored = {
            (r, s): (c, d)
            for r, s, c, d in conn.exec_driver_sql("SELECT run_id, stage, cpu_time_ms, device_time_ms FROM stages")
        }
    ids = chart.frame["id"].tolist()
    assert len(ids) == 4
    # one stacked segment per stage (in step order) and config (in frame order)
    cpu = [stored.get((i, s), (0.0, 0.0))[0] for s in STAGES for i in ids]
    gpu = [stored.get((i, s), (0.0, 0.0))[1] for s in STAGES for i in ids]
    assert [p.get_width() for p in ax_cpu.patches] == pytest.approx(cpu)
    assert [p.get_width() for p in ax_gpu.patches] == pytest.approx(gpu)
    assert "GPU kernel time" in ax_gpu.get_title("left")
    # one scale for both (0-127 ms): side by side under one axis label, 0-120 beside 0-70 misled
    assert ax_cpu.get_xlim() == ax_gpu.get_xlim() and ax_cpu.get_xlim()[1] > max(cpu)
    # once saved, a segment's value is written on it only where it fits inside it ("4.69" ran past its
    # segment in white on the wider shared scale), and the large ones still are
    from perfsweep.report import charts

    charts.save(chart.figure, tmp_path / "breakdown.png")
    renderer = chart.figure.canvas.get_renderer()
    values = [t for ax in (ax_cpu, ax_gpu) for t in ax.texts if t.get_gid() == charts.SEGMENT_VALUE]
    for t in values:
        lo, hi = (t.axes.transData.transform((x, 0))[0] for x in t.segment)
        shown = t.get_visible()
        t.set_visible(True)  # a hidden text measures as a unit box
        width = t.get_window_extent(renderer).width
        t.set_visible(shown)
        assert shown == (width + 4 <= hi - lo), (t.get_text(), width, hi - lo)
    assert len([t for t in values if t.get_visible()]) >= 8  # the large segments keep their values
    assert any(not t.get_visible() for t in values)


def test_runs_stored_before_launch_attribution_get_no_gpu_stage_panel(tmp_path: Path):
    """The H100 database as an older perfsweep wrote it, upgraded: its stages say 'cuda_kernels'
    (kernels counted in the main thread's ranges: backward ~0.002 ms). The breakdown drew them as
    "GPU kernel time, by launching stage" with no backward, and nothing said why; the GPU chart's
    skip blamed the profiled window."""
    import shutil

    from perfsweep.names import DEVICE_TIME_BEFORE_LAUNCH
    from tests.h100 import H100, SEED_SWEEP

    db = tmp_path / "old.db"
    shutil.copy(H100 / "results-fp16-seed-snapshot-gpt2.db", db)
    engine = store.connect(f"sqlite:///{db}")  # the upgrade perfsweep upgrade does
    try:
        with engine.connect() as conn:
            sources = {s for (s,) in conn.exec_driver_sql("SELECT DISTINCT device_time_source FROM stages")}
        assert sources == {DEVICE_TIME_BEFORE_LAUNCH}
        rep = make_report(engine, [SEED_SWEEP])
    finally:
        engine.dispose()
    chart = rep.charts["breakdown"]
    assert not [c for c in chart.frame.columns if c.startswith("gpu_ms_")]
    assert len(chart.figure.axes) == 1  # the CPU panel alone
    title = chart.figure.get_suptitle().replace("\n", " ")
    assert "no GPU time: stored by a perfsweep that missed backward's kernels; perfsweep trace gives it" in title
    assert "On CPU" not in chart.caption and "leaves out backward's" in chart.caption, chart.caption  # H100 runs
    assert "older than the busy-time columns" in rep.charts["gpu"].skipped


def test_ctrl_c_while_a_report_is_drawn_leaves_the_one_there_whole(tmp_path: Path):
    """A report was written in place, a PNG at a time: a Ctrl-C while one was drawn left it missing
    or cut short (124 bytes), under the old report.md that showed it. Now the old report stays,
    byte for byte, nothing half-written is left, and the command says so in one line, exit 130."""
    import hashlib
    import signal
    import time

    from tests.util import finish, run_perfsweep, start_perfsweep

    db = build_h100_db(tmp_path / "results.db").removeprefix("sqlite:///")
    out = tmp_path / "rep"
    done = run_perfsweep(["report", "--db", db, "--sweep", "1", "--out", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}
    assert {"report.md", "gpu.png", "throughput.png"} <= set(before)
    proc = start_perfsweep(["report", "--db", db, "--sweep", "1", "--out", str(out)], tmp_path)
    deadline = time.monotonic() + 60

    def drawing() -> bool:  # a new chart is being written (or, written in place, an old one is gone)
        return bool(list(out.glob(".perfsweep-writing-*/*.png"))) or any(not (out / n).exists() for n in before)

    while not drawing() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = finish(proc, timeout=60)
    assert proc.returncode == 130 and err.strip() == "perfsweep report: interrupted", (proc.returncode, err)
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()} == before


def test_a_report_killed_while_drawing_leaves_a_folder_the_next_one_removes(tmp_path: Path):
    """SIGKILL (or a power cut) mid-draw leaves the scratch folder a report draws into, a PNG or
    more, for good. The next report there removes it, once no live writer holds it (a report still
    drawing keeps its own) and it has not changed for a minute (one made this instant is not locked yet)."""
    import fcntl
    import os
    import signal
    import time

    from perfsweep.report.build import ABANDONED_AFTER_S, SCRATCH_PREFIX
    from tests.util import finish, run_perfsweep, start_perfsweep

    db = build_h100_db(tmp_path / "results.db").removeprefix("sqlite:///")
    out = tmp_path / "rep"
    args = ["report", "--db", db, "--sweep", "1", "--out", str(out)]
    proc = start_perfsweep(args, tmp_path)
    deadline = time.monotonic() + 60
    while not list(out.glob(SCRATCH_PREFIX + "*/*.png")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    finish(proc, timeout=60)
    (killed,) = out.glob(SCRATCH_PREFIX + "*")
    drawing = out / f"{SCRATCH_PREFIX}live"  # another report's, still drawing: it holds the lock
    drawing.mkdir()
    holder = os.open(drawing, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fresh = out / f"{SCRATCH_PREFIX}fresh"  # just made by a report about to lock it
        fresh.mkdir()
        old = time.time() - ABANDONED_AFTER_S - 5
        for folder in (killed, drawing):
            os.utime(folder, (old, old))
        done = run_perfsweep(args, tmp_path)
        assert done.returncode == 0, done.stderr
        left = sorted(p.name for p in out.glob(SCRATCH_PREFIX + "*"))
    finally:
        os.close(holder)
    assert left == sorted([drawing.name, fresh.name]), left
    assert {"report.md", "runs.csv", "throughput.png"} <= {p.name for p in out.iterdir()}


def test_a_folder_named_like_a_report_file_stops_the_report_before_it_replaces_anything(tmp_path: Path):
    """``--out x`` with a folder ``x/runs.csv/``: every other file was replaced and runs.csv stayed
    old beside the new report.md, with an error naming the scratch path."""
    import hashlib

    from perfsweep.report.build import SCRATCH_PREFIX
    from tests.util import run_perfsweep

    db = build_h100_db(tmp_path / "results.db").removeprefix("sqlite:///")
    out = tmp_path / "rep"
    args = ["report", "--db", db, "--sweep", "1", "--out", str(out)]
    assert run_perfsweep(args, tmp_path).returncode == 0
    (out / "runs.csv").unlink()
    (out / "runs.csv").mkdir()
    (out / "runs.csv" / "mine.txt").write_text("a user's file")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir() if p.is_file()}
    res = run_perfsweep(args, tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        f"perfsweep report: {out / 'runs.csv'} is a folder, where the report writes a file of that name; "
        "move it away or give another --out (the report there is left as it was)"
    )
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir() if p.is_file()} == before
    assert (out / "runs.csv" / "mine.txt").read_text() == "a user's file"
    assert not list(out.glob(SCRATCH_PREFIX + "*"))


def test_a_file_that_cannot_be_replaced_leaves_the_old_report_whole(tmp_path: Path):
    """An immutable runs.csv (or another user's, in a sticky shared folder): the files renamed
    before it were the new report's, those after it the old one's, one old chart was gone, and
    the error named the deleted scratch path. Now nothing changes, and the line names the file."""
    import hashlib
    import subprocess

    from perfsweep.report.build import SCRATCH_PREFIX
    from tests.util import run_perfsweep

    db = build_h100_db(tmp_path / "results.db").removeprefix("sqlite:///")
    out = tmp_path / "rep"
    args = ["report", "--db", db, "--sweep", "1", "--out", str(out)]
    assert run_perfsweep(args, tmp_path).returncode == 0
    if subprocess.run(["chattr", "+i", str(out / "runs.csv")], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not permitted here (needs root and a filesystem with the immutable flag)")
    try:
        before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}
        res = run_perfsweep([*args, "--top", "1"], tmp_path)  # another throughput.png
        after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}
    finally:
        subprocess.run(["chattr", "-i", str(out / "runs.csv")], check=True)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        f"perfsweep report: cannot replace {out / 'runs.csv'} (Operation not permitted); the report there is left as it was"
    )
    assert after == before
    assert not list(out.glob(SCRATCH_PREFIX + "*"))
