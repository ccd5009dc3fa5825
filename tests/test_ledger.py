"""The memory ledger: hand counts, torch's own saved tensors, the shared H100 peaks, and the
skip of a config predicted not to fit, through a real sweep."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perfsweep import ledger
from perfsweep.config import GPTConfig
from perfsweep.ledger import GPTShape, Setting
from perfsweep.model import GPT, Block
from tests.util import TINY, run_perfsweep
from tests.util import sqlite_rows as rows

SMALL = GPTShape(n_layers=2, n_heads=2, d_model=32, d_ff=128, max_seq_len=64, vocab_padded=256, bias=True)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("vocab", [256, 1000])
def test_parameter_count_is_the_models(bias: bool, vocab: int) -> None:
    shape = GPTShape(3, 4, 64, 200, 96, vocab, bias)
    model = GPT(
        GPTConfig(n_layers=3, n_heads=4, d_model=64, d_ff=200, max_seq_len=96, bias=bias, vocab_multiple=1), vocab
    )
    assert shape.n_params() == sum(p.numel() for p in model.parameters())


def test_hand_count_of_a_small_model() -> None:
    """Every category counted by hand for SMALL (2 blocks, d 32, f 128, 2 heads, vocab 256), batch 2 x 16."""
    # parameters: embedding 256*32 + positions 64*32 = 10,240; a block: two LayerNorms 2*64,
    # qkv 32*96+96, proj 32*32+32, fc 32*128+128, proj 128*32+32 = 128+3,168+1,056+4,224+4,128 = 12,704;
    # final LayerNorm 64: N = 10,240 + 2*12,704 + 64 = 35,712
    n = 35_712
    assert SMALL.n_params() == n
    fp32 = ledger.predict_gpt(
        SMALL, Setting(batch=2, seq_len=16, amp=False, ckpt=False, compile=False, device_type="cpu")
    )
    tokens = 32
    # a block per token: 32d + 8f = 1,024 + 1,024, LayerNorm stats 16, log-sum-exp 4*2 heads = 2,072 bytes
    block = tokens * 2_072
    edges = tokens * (4 * 32 + 4 * 32)  # block 0's input and the final LayerNorm's output, fp32, no dropout
    assert fp32.params_bytes == 4 * n + 4 * 256  # fp32 weights and the vocabulary mask buffer
    assert fp32.optimizer_bytes == 8 * n and fp32.grads_bytes == 0  # at the start of backward
    assert fp32.activations_bytes == 2 * block + edges == 140_800
    assert fp32.logits_bytes == 12 * tokens * 256 == 98_304  # log-softmax, its gradient, the logits' gradient
    assert fp32.phase == "backward_start" and fp32.slack_bytes == 0
    assert fp32.peak_bytes == 4 * n + 1_024 + 8 * n + 140_800 + 98_304

    amp = ledger.predict_gpt(SMALL, Setting(2, 16, amp=True, ckpt=False, compile=False, device_type="cpu"))
    # 20d + 4f + 16 + 8 = 1,176 bytes a token a block; bf16 copies of the 2 blocks' matmul weights
    # (3,168 + 1,056 + 4,224 + 4,128 = 12,576 each) and of the output layer (8,192), 2 bytes each
    copies = 2 * (2 * 12_576 + 8_192)
    assert amp.activations_bytes == 2 * tokens * 1_176 + tokens * (4 * 32 + 2 * 32) + copies

    ckpt = ledger.predict_gpt(SMALL, Setting(64, 64, amp=False, ckpt=True, compile=False, device_type="cuda"))
    # checkpointed: each block keeps its fp32 input; here the loss's buffers dominate
    tokens = 64 * 64
    assert ckpt.activations_bytes == tokens * (2 * 4 * 32 + 4 * 32 + 4 * 32)
    # on CUDA one fp32 copy more than on CPU is live at the start of backward: 16 bytes per logit
    assert ckpt.logits_bytes == 16 * tokens * 256 and ckpt.phase == "backward_start"
    assert ckpt.slack_bytes == int(ledger.CUDA_SLACK_FRACTION * ckpt.peak_bytes)
    assert ckpt.reserved_bytes == ckpt.peak_bytes + ckpt.slack_bytes


def _saved_bytes(block: Block, x: torch.Tensor, amp: bool) -> int:
    """What one block's forward leaves allocated (its saved tensors and output), from the CPU
    allocator's events, less the autocast weight copies the ledger counts elsewhere."""
    with (
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp),
    ):
        y = block(x)
    live = sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    del y
    copies = 2 * sum(p.numel() for n, p in block.named_parameters() if not n.startswith("ln")) if amp else 0
    return live - copies


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["fused-attention", "math-attention"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(2, 256, 128, 4, 512), (3, 96, 64, 2, 192)], ids=["d128", "d64"])
def test_block_activations_are_what_torch_saves(dropout: float, amp: bool, shape: tuple[int, ...]) -> None:
    batch, seq_len, d, heads, f = shape
    torch.manual_seed(0)
    block = Block(GPTConfig(n_layers=1, n_heads=heads, d_model=d, d_ff=f, max_seq_len=1024, dropout=dropout))
    measured = _saved_bytes(block, torch.randn(batch, seq_len, d, requires_grad=True), amp)
    predicted = ledger.block_activation_bytes(
        GPTShape(1, heads, d, f, 1024, 128, True, dropout), Setting(batch, seq_len, amp, False, False, "cpu")
    )
    assert predicted == pytest.approx(measured, rel=0.005)


# Runs on an H100 80GB HBM3 (torch 2.11.0+cu130, perfsweep commit 87cb5b2, 2026-11-26, benchmarks/gpu_session.sh
# sweeps and tests; docs/benchmarks.md): shape, padded vocabulary, settings, measured peak_allocated_bytes. The
# model=small row is tests/test_gpu.py's checkpointed job; its peak is the one its stored predicted_peak_error
# (-0.18991 against the 332,736,000 bytes the ledger then predicted) implies.
MINIGPT = GPTShape(12, 4, 768, 3072, 1024, 10_112, True, 0.1)
GPT2_SMALL = GPTShape(12, 12, 768, 3072, 2048, 100_352, True, 0.0)
GPT2_UNPADDED = GPTShape(12, 12, 768, 3072, 2048, 100_277, True, 0.0)
H100_RUNS = [
    (MINIGPT, Setting(2, 1024, True, True, False, "cuda"), 1_705_255_936),
    (MINIGPT, Setting(2, 1024, True, False, False, "cuda"), 2_395_523_584),
    (MINIGPT, Setting(2, 1024, False, True, False, "cuda"), 1_696_135_680),
    (MINIGPT, Setting(2, 1024, False, False, False, "cuda"), 2_715_496_448),
    (GPT2_SMALL, Setting(16, 1024, True, False, True, "cuda"), 17_751_604_224),
    (GPT2_UNPADDED, Setting(16, 1024, True, False, True, "cuda"), 17_778_747_904),
    (GPT2_SMALL, Setting(16, 2048, True, False, True, "cuda"), 33_162_402_816),
    (GPTShape(4, 4, 256, 1024, 1024, 10_112, True, 0.1), Setting(8, 256, True, True, False, "cuda"), 410_739_200),
]
H100_FREE_BYTES = int(79.1 * 2**30)


@pytest.mark.parametrize(("shape", "setting", "measured_bytes"), H100_RUNS)
def test_h100_peaks_within_5_percent(shape: GPTShape, setting: Setting, measured_bytes: int) -> None:
    predicted = ledger.predict_gpt(shape, setting)
    assert predicted.peak_bytes == pytest.approx(measured_bytes, rel=0.05)
    assert predicted.fits(H100_FREE_BYTES)  # every config that ran would have run


def test_the_h100_oom_cell_is_skipped_and_its_neighbour_runs() -> None:
    """The H100 database of 2026-11-22 (an older perfsweep; docs/benchmarks.md gives its provenance): gpt2_small
    bf16 + compile at batch 64 x 2048 ran out of memory on the 79.1 GiB card, 64 x 1024 ran."""
    unpadded = GPTShape(12, 12, 768, 3072, 2048, 100_277, True, 0.0)
    assert not ledger.predict_gpt(unpadded, Setting(64, 2048, True, False, True, "cuda")).fits(H100_FREE_BYTES)
    assert ledger.predict_gpt(unpadded, Setting(64, 1024, True, False, True, "cuda")).fits(H100_FREE_BYTES)


def test_a_config_predicted_not_to_fit_is_skipped_not_run(tmp_path: Path) -> None:
    """skip_predicted_oom=true through a real sweep: the huge grid point is stored skipped with
    its prediction and never trains; the small one trains; a skip is not a failure (exit 0)."""
    res = run_perfsweep(["-m", *TINY, "model.d_model=32,65536", "skip_predicted_oom=true", "device=cpu"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    small, huge = rows(tmp_path / "results.db", "SELECT * FROM runs ORDER BY job_num")
    assert small["status"] == "ok" and abs(small["predicted_peak_error"]) < 0.15
    assert huge["status"] == "skipped" and huge["predicted_peak_bytes"] > 400 * 2**30  # 3.4e10 parameters x 16 bytes
    assert huge["error"].startswith("predicted peak ") and "free on cpu" in huge["error"]
    assert huge["tokens_per_s"] is None and huge["peak_allocated_bytes"] is None
    assert rows(tmp_path / "results.db", f"SELECT * FROM steps WHERE run_id = {huge['id']}") == []
    assert "skipped: predicted peak" in res.stderr


@pytest.mark.parametrize(
    ("compile_", "amp", "device", "want"),
    [
        (False, False, "cpu", 12),  # measured on CPU (the hand count above)
        (False, True, "cpu", 12),
        (False, False, "cuda", 16),  # fitted to the H100 runs above
        (False, True, "cuda", 16),
        (True, True, "cpu", 6),  # Inductor fuses the upcast into the loss
        (True, True, "cuda", 6),
        (True, False, "cpu", 12),
        (True, False, "cuda", 12),  # not measured on CUDA: eager CUDA's extra copy is not assumed
    ],
)
def test_bytes_per_logit_by_how_the_step_runs(compile_: bool, amp: bool, device: str, want: int) -> None:
    assert ledger.logit_bytes(Setting(1, 1, amp, False, compile_, device)) == want
