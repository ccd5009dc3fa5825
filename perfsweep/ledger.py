"""The memory ledger: a job's peak memory predicted from its shape and settings, before it runs.

Torch-free arithmetic, so the launcher, the store and the report can all use it. Every term is
a count of the tensors live at the peak, in bytes; the comments say which tensors and where the
count comes from. The prediction is what ``runs.peak_allocated_bytes`` measures (allocator
bytes handed to tensors), so the two sit side by side in ``runs`` and in the report; what the
device must hold on top of that (the caching allocator's unused reserved blocks) is
:data:`CUDA_SLACK_FRACTION`.

Sources:

- 16 bytes per parameter for AdamW with fp32 master weights: parameters 4, gradients 4, the two
  moment buffers 8 (Rajbhandari et al., "ZeRO", 2020, section 3.1, and the seed documents'
  checklist). Autocast keeps the parameters in fp32 and casts copies of the weights for each
  matmul; the copies are saved for backward, so they are live at the peak (2 bytes each).
- Activations per transformer block: the saved-tensor count of Korthikanti et al., "Reducing
  Activation Recomputation in Large Transformer Models", 2022, section 4.1 (34 bytes per token
  and hidden unit plus 5·heads·seq_len for 16-bit activations with the attention matrix
  materialised), redone for this GPT's ops and torch's kernels; the coefficients below were
  counted tensor by tensor and checked against torch 2.13's saved tensors on CPU
  (tests/test_ledger.py measures one block's saved bytes and compares).
- Fused attention (flash, memory-efficient; FlashAttention, Dao et al. 2022) saves its output
  and the log-sum-exp, never the seq_len x seq_len matrix; its output is already laid out
  (batch, seq, heads, head_dim), so the transpose back costs nothing. torch's CPU kernel takes
  that path without dropout; with dropout the CPU falls back to the math path, which saves the
  softmax, the dropout mask and the dropped-out matrix (12 bytes per attention element, fp32
  even under autocast, whose softmax runs in fp32).
- Cross-entropy over the (padded) vocabulary in eager mode: at the start of backward the saved
  log-softmax, its gradient and the logits' gradient are live at once, 3 fp32 copies of
  batch x seq_len x vocab (12 bytes per logit), measured on CPU. On CUDA one more fp32 copy is
  live at the peak, 16 bytes per logit: fitted to this GPT on an H100 (torch 2.11, commit
  87cb5b2, 2026-11-26: minigpt_seed fp32 and fp16 AMP, batch 2 x 1024, vocabulary 10,112, and
  model=small bf16 AMP with checkpointing, batch 8 x 256), which left the predicted peaks 1.1%
  low to 1.2% high; with 12 they were 3% to 19% low. Which tensor the fourth copy is was not
  traced (it needs a memory snapshot on a GPU). Under torch.compile with AMP, Inductor fuses the
  upcast and the loss: 6 bytes per logit, on CUDA (gpt2_small, bf16 + compile, the same H100
  session: 0.3% to 0.6% low at batch 16 x seq_len 1024 and 2048) and on CPU (model=tiny,
  bf16 + compile, batch 2/4/16 x seq_len 128/256, vocab 8192, torch 2.13 on a Xeon,
  2026-11-24: 6.0 each). The 8 bytes once calibrated on the shared H100 runs
  (../shared/gpu/h100-2026-11-22, commit 6f6ede7) measured a training step that still held the
  bf16 logits through backward (2 bytes per logit: ``_, loss = self.model(x, y)``), which
  perfsweep's step no longer does.
  Compiled in fp32 there is no upcast to fuse: 12 bytes, as eager on CPU (measured there; not
  measured on CUDA).

The peak is the larger of two moments: the start of backward (every saved activation and the
loss's buffers live, no gradient yet: ``zero_grad(set_to_none=True)`` freed them) and the end of
backward (every gradient made; with checkpointing, the first block's recomputed activations
and the checkpointed block inputs still live). ``phase`` says which it was.
"""

from __future__ import annotations

from dataclasses import dataclass

FP32 = 4
HALF = 2  # bf16 and fp16
MASK = 1  # dropout masks are bool tensors

CUDA_SLACK_FRACTION = 0.15
"""Reserved-but-unused memory of the CUDA caching allocator, as a share of the allocated peak:
on an H100 (torch 2.11, commit 87cb5b2, 2026-11-26: minigpt_seed amp x ckpt and gpt2_small bf16 +
compile, 7 runs) peak reserved / peak allocated was 1.03-1.19, median 1.156, the highest for
minigpt_seed fp16 with checkpointing. The shared H100 runs of an older perfsweep gave 1.02-1.21,
median 1.065. Stored as ``predicted_slack_bytes`` and added only by
:attr:`Ledger.reserved_bytes`; the predicted peak compares with allocated bytes."""

SKIP_MARGIN_FRACTION = 0.05
"""``skip_predicted_oom=true`` skips a config whose predicted peak exceeds the device's free
memory less this share of it. Slack is deliberately not added: a config that runs out of memory
anyway costs one job and is stored as ``oom``, a config skipped that would have fit loses a
result. On the shared H100 database (gpt2_small, bf16 + compile, a 79.1 GiB card) the rule runs
batch 64 x 1024 (predicted 59.4 GiB; it ran, at 71.8 GiB allocated under an older perfsweep whose
step held the logits through backward) and skips 64 x 2048 (predicted 117 GiB), which ran out."""

LOGIT_BYTES_EAGER: dict[str, int] = {"cpu": 3 * FP32, "cuda": 4 * FP32}
"""Bytes per logit at the start of backward in eager mode, by device (see the module text); a
device not measured takes CUDA's figure."""
LOGIT_BYTES_COMPILED_AMP = 6
"""Bytes per logit at the start of backward under torch.compile with AMP, on CPU and CUDA alike."""
LOGIT_BYTES_COMPILED_FP32 = LOGIT_BYTES_EAGER["cpu"]
"""Compiled without AMP, on any device: measured on CPU only. CUDA's fourth eager copy is not
assumed for it; predicting too little costs an oom row, too much a config skipped that fits."""


def logit_bytes(s: Setting) -> int:
    """Bytes per logit live at the start of backward (the loss's buffers), by how the step runs."""
    if s.compile:
        return LOGIT_BYTES_COMPILED_AMP if s.amp else LOGIT_BYTES_COMPILED_FP32
    return LOGIT_BYTES_EAGER.get(s.device_type, LOGIT_BYTES_EAGER["cuda"])


@dataclass(frozen=True)
class GPTShape:
    """The shape keys of perfsweep's GPT (config.GPTConfig) and the padded vocabulary."""

    n_layers: int
    n_heads: int
    d_model: int
    d_ff: int
    max_seq_len: int
    vocab_padded: int
    bias: bool = True
    dropout: float = 0.0

    def n_params(self) -> int:
        """Parameters of perfsweep.model.GPT, counted once (the output layer is tied to the
        token embedding)."""
        d, f, b = self.d_model, self.d_ff, int(self.bias)
        ln = d * (1 + b)  # LayerNorm weight (+ bias)
        block = 2 * ln + (3 * d * d + 3 * d * b) + (d * d + d * b) + (d * f + f * b) + (f * d + d * b)
        return self.vocab_padded * d + self.max_seq_len * d + self.n_layers * block + ln

    def matmul_weights(self) -> int:
        """Elements of the weights autocast casts (every Linear's weight and bias, the output layer)."""
        d, f, b = self.d_model, self.d_ff, int(self.bias)
        block = (3 * d * d + 3 * d * b) + (d * d + d * b) + (d * f + f * b) + (f * d + d * b)
        return self.n_layers * block + self.vocab_padded * d


@dataclass(frozen=True)
class Setting:
    """What of a job's config changes its memory besides the model's shape."""

    batch: int
    seq_len: int
    amp: bool
    ckpt: bool
    compile: bool
    device_type: str  # cpu | cuda


def attention_impl(device_type: str, dropout: float) -> str:
    """The SDPA kernel torch picks: ``fused`` (flash or memory-efficient: no seq_len² tensor)
    or ``math`` (the CPU with dropout > 0). On CUDA torch has a fused kernel for every dtype
    this GPT runs in (memory-efficient attention covers fp32 and dropout)."""
    return "math" if device_type == "cpu" and dropout > 0 else "fused"


def block_activation_bytes(shape: GPTShape, s: Setting) -> int:
    """Bytes one block saves for backward (its output included, its input not: that is the
    previous block's output), for ``s.batch`` x ``s.seq_len`` tokens.

    Per token, with d = d_model and f = d_ff, fp32 (no autocast):
      LayerNorm 1 output 4d (the qkv matmul's input), q, k, v 12d, attention output 4d (the
      projection's input), the residual after attention 4d (LayerNorm 2's input), LayerNorm 2
      output 4d, MLP hidden before and after GELU 4f + 4f, the block's output 4d: 32d + 8f.
    Under autocast the matmul inputs and outputs are 16-bit, the residual stream and LayerNorm
      inputs stay fp32: 2d + 6d + 2d + 4d + 2d + 2f + 2f + 4d = 20d + 4f.
    Dropout (p > 0) adds two 1-byte masks (attention and MLP residual branches): 2d.
    The math attention path (CPU with dropout) saves, instead of the fused kernel's log-sum-exp
      (4 bytes per head and token), 12 bytes per element of the heads x seq_len x seq_len
      matrix (softmax output, dropout mask, dropped-out matrix; fp32 even under autocast) and
      6d (fp32) or 8d (autocast) of scaled and re-laid-out q, k and output: counted from torch
      2.13's saved tensors, which tests/test_ledger.py measures for every variant.
    LayerNorm's mean and rstd: 16 bytes per token.
    """
    d, f, h, T = shape.d_model, shape.d_ff, shape.n_heads, s.seq_len
    per_token = (20 * d + 4 * f) if s.amp else (32 * d + 8 * f)
    per_token += 16  # two LayerNorms' mean and rstd, fp32
    if shape.dropout > 0:
        per_token += 2 * MASK * d
    if attention_impl(s.device_type, shape.dropout) == "math":
        per_token += (8 if s.amp else 6) * d + 12 * h * T
    else:
        per_token += FP32 * h
    return per_token * s.batch * T


@dataclass(frozen=True)
class Ledger:
    """Predicted bytes by category at the predicted peak; they add up to ``peak_bytes``."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    """Saved activations, autocast's weight copies and the checkpointed block inputs."""
    logits_bytes: int
    """The loss's buffers over the vocabulary (zero where the peak is at the end of backward)."""
    slack_bytes: int
    phase: str
    """backward_start or backward_end: which moment is the peak."""
    attention: str

    @property
    def peak_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.logits_bytes

    @property
    def reserved_bytes(self) -> int:
        """What the device must hold: the peak and the allocator's slack."""
        return self.peak_bytes + self.slack_bytes

    def fits(self, free_bytes: int) -> bool:
        """The ``skip_predicted_oom`` rule (see :data:`SKIP_MARGIN_FRACTION`)."""
        return self.peak_bytes <= free_bytes * (1.0 - SKIP_MARGIN_FRACTION)

    def row(self) -> dict[str, int | str]:
        """The ``runs`` columns."""
        return {
            "predicted_params_bytes": self.params_bytes,
            "predicted_grads_bytes": self.grads_bytes,
            "predicted_optimizer_bytes": self.optimizer_bytes,
            "predicted_activations_bytes": self.activations_bytes,
            "predicted_logits_bytes": self.logits_bytes,
            "predicted_slack_bytes": self.slack_bytes,
            "predicted_peak_bytes": self.peak_bytes,
            "predicted_peak_phase": self.phase,
        }


def predict_gpt(shape: GPTShape, s: Setting) -> Ledger:
    """The ledger of one training step of perfsweep's GPT with fused AdamW (see the module text)."""
    n = shape.n_params()
    d, tokens = shape.d_model, s.batch * s.seq_len
    params = FP32 * n + FP32 * shape.vocab_padded  # + the vocab mask buffer
    optimizer = 2 * FP32 * n  # exp_avg, exp_avg_sq
    grads = FP32 * n
    weight_copies = HALF * shape.matmul_weights() if s.amp else 0
    block = block_activation_bytes(shape, s)
    # outside the blocks: the embedding sum's dropout mask, block 0's input (fp32) and the final
    # LayerNorm's output (the output layer's input, 16-bit under autocast)
    edges = tokens * (FP32 * d + (MASK * d if shape.dropout > 0 else 0) + (HALF if s.amp else FP32) * d)
    logits = logit_bytes(s) * tokens * shape.vocab_padded
    if s.ckpt:  # each block keeps its input; one block's activations exist again in its backward
        saved = shape.n_layers * FP32 * d * tokens + edges
        recomputed = block + (weight_copies // max(shape.n_layers, 1) if s.amp else 0)
        start = saved + logits
        end = saved + recomputed
    else:
        saved = shape.n_layers * block + edges + weight_copies
        start = saved + logits
        end = block  # the last block whose backward runs, and every gradient
    at_start = start
    at_end = grads + end
    phase = "backward_start" if at_start >= at_end else "backward_end"
    if phase == "backward_start":
        acts, lg, gr = start - logits, logits, 0
    else:
        acts, lg, gr = end, 0, grads
    slack = int(CUDA_SLACK_FRACTION * (params + optimizer + gr + acts + lg)) if s.device_type == "cuda" else 0
    return Ledger(params, gr, optimizer, acts, lg, slack, phase, attention_impl(s.device_type, shape.dropout))
