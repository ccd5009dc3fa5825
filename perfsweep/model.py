"""A small GPT, written to be read in one sitting (after nanoGPT's model.py).

Pre-LayerNorm blocks, causal scaled_dot_product_attention, a GELU MLP and an output layer
tied to the token embedding. It is one model among any (perfsweep.task): :func:`build` is the
factory its presets name, and ``ckpt=true`` wraps each :class:`Block` (``ckpt_modules: [Block]``),
so the saved activations shrink from every block's internals to one residual tensor per block.

The embedding and output layer are padded to a multiple of ``model.vocab_multiple`` rows:
GEMM kernels tile the output dimension, and cl100k's 100,277 columns leave a ragged last tile
(padding to 100,352 measured +13% tokens/s on an H100). The padded columns get a -inf bias, so
they never take probability mass: the loss and every real row's gradient are those of the
unpadded model, and padded rows receive zero gradient.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from perfsweep.config import GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def padded_vocab(vocab_size: int, multiple: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple``."""
    return -(-vocab_size // multiple) * multiple


class GPTOutput(NamedTuple):
    logits: torch.Tensor
    loss: torch.Tensor | None


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.vocab_size_padded = padded_vocab(vocab_size, cfg.vocab_multiple)
        self.tok_emb = nn.Embedding(self.vocab_size_padded, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.head = nn.Linear(cfg.d_model, self.vocab_size_padded, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying, as in GPT-2
        # -inf on the padded logits (None when nothing is padded): a bias the output GEMM adds in
        # its epilogue, cheaper than slicing or masking the large logits tensor afterwards.
        mask = None
        if self.vocab_size_padded > vocab_size:
            mask = torch.zeros(self.vocab_size_padded)
            mask[vocab_size:] = float("-inf")
        self.register_buffer("vocab_mask", mask, persistent=False)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * cfg.n_layers) ** 0.5)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> GPTOutput:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.head.weight, self.vocab_mask)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))
        return GPTOutput(logits[..., : self.vocab_size], loss)  # a view: callers see the real vocabulary

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; the tied output layer is counted once, as the embedding."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token: 6N for the matmuls plus 12*L*H*Dh*T for attention.

        The convention of nanoGPT's estimate_mfu and torchtitan: N counts non-embedding
        parameters, and the attention term counts QK^T and AV forward and backward. The output
        layer counts the real vocabulary only: padded columns are work, but not useful work.
        """
        c = self.cfg
        head_dim = c.d_model // c.n_heads
        # The output layer is tied to the embedding but still a matmul on every token.
        n_matmul = self.num_params(non_embedding=True) + self.vocab_size * c.d_model
        return 6 * n_matmul + 12 * c.n_layers * c.n_heads * head_dim * seq_len


def build(vocab_size: int | None = None, **shape: Any) -> GPT:
    """The factory the GPT presets name (``model._target_``): the shape keys of :class:`GPTConfig`,
    and the vocabulary of the token data perfsweep passes in."""
    if vocab_size is None:
        raise ValueError("perfsweep's GPT needs token data (data=stdlib, textfile or synthetic) for its vocabulary")
    return GPT(GPTConfig(**shape), vocab_size)
