from __future__ import annotations

import pytest
import torch

from perfsweep.config import GPTConfig, ModelConfig
from perfsweep.model import GPT, padded_vocab
from perfsweep.task import apply_checkpointing

CFG = GPTConfig(n_layers=2, n_heads=2, d_model=32, d_ff=64, max_seq_len=64, dropout=0.0)
UNPADDED = GPTConfig(**{**CFG.__dict__, "vocab_multiple": 1})


def gpt(cfg: GPTConfig, vocab_size: int, ckpt: bool = False) -> GPT:
    """The GPT as a job builds it: ckpt=true wraps its blocks through perfsweep.task."""
    model = GPT(cfg, vocab_size)
    if ckpt:
        assert apply_checkpointing(model, ModelConfig(name="t", ckpt_modules=["Block"])) == cfg.n_layers
    return model


def test_shapes_and_loss_near_uniform_at_init():
    torch.manual_seed(0)
    model = GPT(CFG, vocab_size=100)
    idx = torch.randint(0, 100, (3, 16))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 16, 100)
    # small init: the first loss is close to ln(vocab)
    assert abs(loss.item() - torch.log(torch.tensor(100.0)).item()) < 0.5
    logits, loss = model(idx)
    assert loss is None


def test_embedding_tied_and_param_counts():
    model = GPT(UNPADDED, vocab_size=100)
    assert model.head.weight is model.tok_emb.weight
    total = sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - 100 * 32 - 64 * 32
    per_block = 4 * 32 * 32 + 4 * 32 + 2 * 32 * 64 + 64 + 32 + 4 * 32  # attn, mlp, 2 layernorms
    assert model.num_params() == 2 * per_block + 2 * 32  # + final layernorm


@pytest.mark.parametrize("cfg", [UNPADDED, CFG], ids=["unpadded", "padded"])
def test_flops_per_token_follows_nanogpt_convention(cfg):
    model = GPT(cfg, vocab_size=100)
    # nanoGPT counts the tied output matmul (over the real vocabulary, padding is not useful work)
    n = model.num_params() + 100 * 32
    assert model.flops_per_token(16) == 6 * n + 12 * 2 * 2 * 16 * 16


def test_padded_vocab_sizes():
    assert padded_vocab(100_277, 128) == 100_352  # cl100k, as the gpt2_small preset runs it
    assert padded_vocab(10_000, 128) == 10_112 and padded_vocab(8192, 128) == 8192
    assert padded_vocab(50_257, 1) == 50_257


def test_vocab_padding_keeps_loss_logits_and_gradients():
    """Padded rows are never targets and get no probability: loss and real gradients unchanged."""
    idx = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    plain = GPT(UNPADDED, vocab_size=100).train()
    padded = GPT(CFG, vocab_size=100).train()
    assert padded.vocab_size_padded == 128 and padded.tok_emb.weight.shape == (128, 32)
    with torch.no_grad():
        for name, p in padded.named_parameters():
            src = dict(plain.named_parameters())[name]
            p[: src.shape[0]].copy_(src) if name == "tok_emb.weight" else p.copy_(src)
    (lp, loss_p), (lq, loss_q) = plain(idx, idx), padded(idx, idx)
    torch.testing.assert_close(loss_q, loss_p)
    torch.testing.assert_close(lq, lp)  # the padded model's logits are the real vocabulary's
    loss_p.backward()
    loss_q.backward()
    for name, p in padded.named_parameters():
        ref = dict(plain.named_parameters())[name].grad
        if name == "tok_emb.weight":
            torch.testing.assert_close(p.grad[:100], ref)
            assert torch.count_nonzero(p.grad[100:]) == 0  # padded rows learn nothing
        else:
            torch.testing.assert_close(p.grad, ref, msg=name)


def test_causal_future_tokens_do_not_change_the_past():
    torch.manual_seed(0)
    model = GPT(CFG, vocab_size=50).eval()
    a = torch.randint(0, 50, (1, 10))
    b = a.clone()
    b[0, 7:] = (b[0, 7:] + 1) % 50
    la, _ = model(a)
    lb, _ = model(b)
    torch.testing.assert_close(la[0, :7], lb[0, :7])
    assert not torch.allclose(la[0, 7:], lb[0, 7:])


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_checkpointing_gives_same_loss_and_gradients(dropout):
    cfg = GPTConfig(**{**CFG.__dict__, "dropout": dropout})
    idx = torch.randint(0, 80, (2, 24), generator=torch.Generator().manual_seed(1))
    results = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = gpt(cfg, vocab_size=80, ckpt=ckpt).train()
        torch.manual_seed(123)  # same dropout masks; non-reentrant checkpoint replays the RNG state
        _, loss = model(idx, idx)
        loss.backward()
        grads = {n.replace("._checkpoint_wrapped_module", ""): p.grad.clone() for n, p in model.named_parameters()}
        results.append((loss.detach(), grads))
    (l0, g0), (l1, g1) = results
    torch.testing.assert_close(l0, l1)
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g0[name], g1[name], rtol=1e-5, atol=1e-6, msg=name)


def test_checkpointing_saves_activation_memory():
    """With ckpt each block keeps only its input for backward: fewer saved tensors."""
    cfg = GPTConfig(**{**CFG.__dict__, "n_layers": 4})
    idx = torch.randint(0, 80, (2, 32))

    def saved_bytes(ckpt: bool) -> int:
        model = gpt(cfg, vocab_size=80, ckpt=ckpt).train()
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _, loss = model(idx, idx)
        return total

    assert saved_bytes(True) < 0.6 * saved_bytes(False)


@pytest.mark.parametrize("fused_refused", [False, True], ids=["this-torch", "refused-as-in-2.3"])
def test_the_optimizer_is_fused_as_it_says_and_steps(tmp_path, monkeypatch, fused_refused: bool):
    """The ``optimizer_fused`` a run stores is what its groups run. torch 2.3, with no fused AdamW
    on CPU, refused ``fused=True`` there after writing it into the groups it was handed; the
    fallback once reused them, ran the fused kernel anyway and failed every CPU job at the first
    step (found running the suite under torch 2.3.1). torch >= 2.4 takes it on CPU, so that
    refusal is played here by an AdamW that does what 2.3's did: take the groups, then refuse."""
    from perfsweep.runner import make_optimizer
    from tests.test_profiling import tiny_cfg

    class RefusesFused(torch.optim.AdamW):
        def __init__(self, params, *args, fused=None, **kwargs):
            super().__init__(params, *args, fused=fused, **kwargs)  # writes fused into the groups
            if fused:
                raise RuntimeError("`fused=True` requires all the params to be ... of supported devices")

    if fused_refused:
        monkeypatch.setattr(torch.optim, "AdamW", RefusesFused)
    torch.manual_seed(0)
    model = GPT(CFG, vocab_size=100)
    optimizer, fused = make_optimizer(model, tiny_cfg(tmp_path))
    assert fused is not fused_refused
    assert [bool(g["fused"]) for g in optimizer.param_groups] == [fused, fused]
    idx = torch.randint(0, 100, (2, 8))
    model(idx, idx)[1].backward()
    before = model.head.weight.detach().clone()
    optimizer.step()
    assert not torch.equal(before, model.head.weight)
