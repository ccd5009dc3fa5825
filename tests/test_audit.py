"""The numerics audit (perfsweep.audit) through real sweeps: correct settings pass, a diverging one
is flagged with its step; checkpointing replays dropout exactly; fp16's GradScaler on a GPU."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from perfsweep.audit import first_divergence, tolerance
from perfsweep.names import LOSS_TOLERANCE
from tests.util import TINY, run_perfsweep
from tests.util import sqlite_rows as rows


def test_first_divergence_over_the_steps_both_ran() -> None:
    twin = {0: 10.0, 1: 9.0, 2: 8.0, 3: 7.0}
    assert first_divergence({0: 10.0, 1: 9.0, 2: 8.0}, twin, 1e-3) == (None, 0.0)
    assert first_divergence({0: 10.0, 1: 9.05, 2: 8.4, 3: 7.0, 4: 1.0}, twin, 0.02) == (2, pytest.approx(0.05))
    step, worst = first_divergence({0: 10.0, 1: math.nan}, twin, 0.02)
    assert step == 1 and worst == math.inf  # a non-finite loss where the twin's is finite
    # a NaN loss is stored as NULL (every step has a loss otherwise): it is out too
    assert first_divergence({0: 10.0, 1: None}, twin, 0.02) == (1, math.inf)
    assert first_divergence({0: 10.0, 1: 9.0}, {0: 10.0, 1: None}, 0.02) == (None, 0.0)  # the twin's own: no comparison
    assert tolerance(False, "bf16") == LOSS_TOLERANCE["fp32"] and tolerance(True, "bf16") == LOSS_TOLERANCE["bf16"]


def test_correct_settings_pass_and_checkpointing_replays_dropout(tmp_path: Path) -> None:
    res = run_perfsweep(["-m", *TINY, "amp=true,false", "ckpt=true,false", "model.dropout=0.1", "device=cpu"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = {(r["amp"], r["ckpt"]): r for r in rows(tmp_path / "results.db", "SELECT * FROM runs")}
    twin = runs[(0, 0)]
    assert twin["numerics_warning"] is None and twin["numerics_twin_run_id"] is None  # it is the reference
    for key in ((1, 1), (1, 0), (0, 1)):
        r = runs[key]
        assert r["numerics_twin_run_id"] == twin["id"] and r["numerics_warning"] == 0, r
        assert r["numerics_diverged_step"] is None and r["loss_max_rel_diff"] < LOSS_TOLERANCE["bf16"]
    # dropout masks are drawn again when a checkpointed block recomputes: the same RNG state, the same loss
    assert runs[(0, 1)]["loss_max_rel_diff"] == 0.0
    assert runs[(0, 0)]["grad_scaler_final_scale"] is None  # no GradScaler without fp16
    assert "numerics" not in res.stdout.split("Sweep 1")[1].splitlines()[1]  # no column when nothing is flagged


def test_a_diverging_setting_is_flagged_with_its_step(tmp_path: Path) -> None:
    """lr=0.5 makes this model's training unstable: bf16 and fp32 part ways within a few steps,
    so the AMP run is flagged; the audit is in the summary, runs and report.md."""
    res = run_perfsweep(["-m", *TINY, "amp=true,false", "lr=0.5", "device=cpu"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    amp, fp32 = rows(tmp_path / "results.db", "SELECT * FROM runs ORDER BY amp DESC")
    assert amp["numerics_twin_run_id"] == fp32["id"] and amp["numerics_warning"] == 1
    assert amp["loss_max_rel_diff"] > LOSS_TOLERANCE["bf16"] and amp["numerics_diverged_step"] >= 1
    losses = {r["run_id"]: r["loss"] for r in rows(tmp_path / "results.db", "SELECT * FROM steps") if r["step"] == 0}
    assert losses[amp["id"]] == pytest.approx(losses[fp32["id"]], rel=1e-3)  # same first batch, same start
    assert f"diverged at step {amp['numerics_diverged_step']}" in res.stdout
    report = subprocess.run(
        [sys.executable, "-m", "perfsweep.report", "--db", "results.db", "--sweep", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr
    md = next(tmp_path.glob("multirun/*/*/report/report.md")).read_text()
    assert "**Numerics warning:** amp=on" in md and "## Numerics: loss against the FP32-eager twin" in md
    assert "**numerics warning**" in md


def test_a_training_that_blows_up_is_flagged_even_as_the_reference(tmp_path: Path) -> None:
    """lr=1e30 sends the weights to infinity after the first step: every measured loss is NaN. The
    run is FP32 eager (nothing to compare with), and is flagged all the same; in SQLite its NaN
    losses are NULL, as on every backend."""
    res = run_perfsweep(["-m", *TINY, "lr=1e30", "device=cpu"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = rows(tmp_path / "results.db", "SELECT * FROM runs")
    assert run["status"] == "ok" and run["nonfinite_loss_steps"] == 3 and run["numerics_warning"] == 1
    assert run["final_loss"] is None and run["numerics_twin_run_id"] is None
    losses = rows(tmp_path / "results.db", "SELECT loss FROM steps WHERE phase = 'measure'")
    assert [r["loss"] for r in losses] == [None] * 3
    assert "loss NaN/inf at 3 steps" in res.stdout and "numerics: the loss was NaN or infinite" in res.stdout
    report = subprocess.run(
        [sys.executable, "-m", "perfsweep.report", "--db", "results.db"], cwd=tmp_path, capture_output=True, text=True
    )
    assert report.returncode == 0, report.stderr
    md = next(tmp_path.glob("multirun/*/*/report/report.md")).read_text()
    assert "**Numerics warning:** tiny batch=4 seq_len=32: the loss was NaN or infinite" in md
    table = md.split("## Numerics")[1]
    assert "| diverged at step | NaN/inf loss steps | verdict |" in table
    assert "| - | 0.1% | - | 3 | **numerics warning** |" in table  # no twin; the count; the verdict


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (fp16 autocast and GradScaler)")
def test_fp16_grad_scaler_figures_and_an_underflowing_scale_on_gpu(tmp_path: Path) -> None:
    """A spawned GPU sweep: fp16 at torch's default scale trains like its twin and reports its
    scale; a scale of 2**-24 underflows the fp16 gradients to zero, the loss stays put, the audit flags it."""
    res = run_perfsweep(
        [
            "-m",
            *(a for a in TINY if not a.startswith("data=")),
            "data=stdlib",  # real text: the loss falls, so a run that cannot learn is seen
            "amp=true,false",
            "amp_dtype=fp16",
            "grad_scaler_init_scale=65536,5.96e-08",
            "steps.measure=20",
            "lr=0.003",
            "device=cuda",
        ],
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = {
        r["config_json"].count("65536") > 0: r
        for r in rows(tmp_path / "results.db", "SELECT * FROM runs WHERE amp = 1")
    }
    good, tiny_scale = runs[True], runs[False]
    assert good["grad_scaler_final_scale"] > 0 and good["grad_scaler_skipped_steps"] >= 0
    assert good["numerics_warning"] == 0, good
    assert tiny_scale["numerics_warning"] == 1 and tiny_scale["numerics_diverged_step"] is not None
