"""A Hugging Face causal LM swept by perfsweep: a small Llama built from a config, random weights.

Nothing is downloaded: the model is built from a ``LlamaConfig`` (no hub, no checkpoint), and it
trains on perfsweep's own tokenized corpus (the stdlib sources, cl100k ids capped at
``data.vocab_limit``). From the repository root, after ``pip install -e ".[hf]"``::

    python -m perfsweep -m -cd examples -cn hf_causal_lm amp=true,false ckpt=true,false

The config (``hf_causal_lm.yaml``) names :func:`build` as ``model._target_``; its keys beside the
contract's (``hidden_size``, ``layers``...) are this function's arguments, and perfsweep adds
``vocab_size`` from the data. The forward returns a ``CausalLMOutputWithPast``; with
``model.loss=cross_entropy`` perfsweep takes its ``.logits`` against the batch's next tokens.
``ckpt=true`` wraps each ``LlamaDecoderLayer`` (``model.ckpt_modules``), or, with
``model.ckpt_impl=hf``, calls the model's own ``gradient_checkpointing_enable()``.
"""

from __future__ import annotations

import os

from torch import nn


def build(
    vocab_size: int,
    hidden_size: int = 256,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate_size: int = 688,
    max_position_embeddings: int = 1024,
    attn_implementation: str = "sdpa",
) -> nn.Module:
    """A ``LlamaForCausalLM`` of this shape, initialised the way transformers does from scratch."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # building from a config needs no hub; make sure
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=True,
        use_cache=False,  # training: no KV cache
        attn_implementation=attn_implementation,
    )
    return LlamaForCausalLM(config)
