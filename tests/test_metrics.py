from __future__ import annotations

import numpy as np
import pytest

from perfsweep.metrics import StepRecord, percentile, summarize


@pytest.mark.parametrize("q", [0, 10, 50, 90, 100])
def test_percentile_matches_numpy(q):
    xs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))


def test_summary_excludes_warmup_and_uses_total_time():
    recs = [StepRecord(0, "warmup", 1000.0, 900.0, 9.0), StepRecord(1, "warmup", 500.0, 1.0, 8.0)]
    recs += [StepRecord(2 + i, "measure", t, 1.0, 7.0 - i) for i, t in enumerate([100.0, 200.0, 100.0, 100.0])]
    s = summarize(recs, tokens_per_step=512, samples_per_step=4)
    assert s["first_step_ms"] == 1000.0
    assert s["step_time_ms_median"] == 100.0
    assert s["step_time_ms_p90"] == pytest.approx(170.0)
    # 4 steps x 512 tokens over 0.5 s, not the mean of per-step rates
    assert s["tokens_per_s"] == pytest.approx(4 * 512 / 0.5)
    assert s["samples_per_s"] == pytest.approx(4 * 4 / 0.5)
    assert s["data_wait_fraction"] == pytest.approx(4 / 500)
    assert s["final_loss"] == 4.0


def test_summary_needs_measured_steps():
    with pytest.raises(ValueError):
        summarize([StepRecord(0, "warmup", 1.0, 0.0, 1.0)], 1, 1)
