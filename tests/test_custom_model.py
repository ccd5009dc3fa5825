"""Your own model (issue 13): a module outside the repository, the shipped examples, the contract's refusals.

Every sweep here runs the CLI as a user would, in a fresh folder, with the model's file importable
from that folder (the launch directory) or through PYTHONPATH, never from the repository.
"""

from __future__ import annotations

import importlib.util
import json
import os
import textwrap
from pathlib import Path

import pytest
import torch

from perfsweep import task
from perfsweep.config import ConfigError, Loss, ModelConfig, PerfsweepConfig, Unit
from tests.util import REPO, run_perfsweep, sqlite_rows

FAST = [
    "device=cpu",  # asserts CPU behaviour (memory counted by torch.profiler, bf16 on the CPU)
    "steps.warmup=1",
    "steps.stable_window=0",
    "steps.measure=3",
    "profile.wait=0",
    "profile.warmup=0",
    "profile.active=1",
    "report=false",
]

USER_MODEL = '''
import os

import torch
import torch.nn.functional as F
from torch import nn


class MyBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """Returns the loss itself: model.loss=output, the batch (inputs, targets) as its arguments."""

    def __init__(self, vocab_size, width, depth):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, width)
        self.blocks = nn.ModuleList(MyBlock(width) for _ in range(depth))
        self.out = nn.Linear(width, vocab_size, bias=False)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.out(x).flatten(0, 1).float(), targets.flatten())


def build(vocab_size, width=64, depth=4):
    return TinyLM(vocab_size, width, depth)


def not_a_module(vocab_size):
    return {"weights": 1}


class Logits(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 16)
        self.out = nn.Linear(16, vocab_size)

    def forward(self, idx, targets=None):
        return self.out(self.emb(idx))


def logits_only(vocab_size):
    return Logits(vocab_size)


def raises(vocab_size):
    raise RuntimeError("weights file missing")


class WeightsError(Exception):
    def __init__(self, path, why):  # two arguments: not rebuilt from its args, as pickle would
        super().__init__(f"{path}: {why}")


def raises_its_own(vocab_size):
    raise WeightsError("w.pt", "truncated")


def raises_bare(vocab_size):
    raise ImportError()  # as transformers does where it has disabled itself for an older torch


def exits(vocab_size):
    os._exit(5)  # as a crash in native code ends a process: no exception, no word


class Pairs(torch.utils.data.Dataset):
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.arange(self.length + 1) % 100
        return x[:-1], x[1:]


def fixed_length():
    return Pairs(12)  # ignores seq_len


def own_batches(seq_len):
    return torch.utils.data.DataLoader(Pairs(seq_len), batch_size=3)  # ignores batch


def one_pass(seq_len):
    return (Pairs(seq_len)[i] for i in range(3))


def dies_in_the_job(vocab_size):
    """Trains in the sweep's checks; in the job process, exits at its first step without a word."""
    import multiprocessing
    import os

    model = TinyLM(vocab_size, 16, 1)
    if multiprocessing.current_process().name.startswith("perfsweep-job"):
        model.forward = lambda *args, **kwargs: os._exit(3)
    return model


class ProfilerHungry(TinyLM):
    """Trains, then runs out of memory in the profiled window: a CPU job profiles one step for its
    memory figure, then the window; the second profiled forward asks the allocator for a petabyte."""

    def __init__(self, vocab_size):
        super().__init__(vocab_size, 16, 1)
        self.profiled_forwards = 0

    def forward(self, idx, targets):
        if torch.autograd.profiler._is_profiler_enabled:
            self.profiled_forwards += 1
            if self.profiled_forwards > 1:
                torch.empty(2**50, dtype=torch.uint8)
        return super().forward(idx, targets)


def profiler_hungry(vocab_size):
    return ProfilerHungry(vocab_size)
'''

DATA = ["data=synthetic", "data.synthetic_vocab=512", "data.synthetic_tokens=20000"]


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """A folder outside the repository holding the user's model file, the launch directory."""
    (tmp_path / "usermodels.py").write_text(textwrap.dedent(USER_MODEL))
    return tmp_path


def matmul_flops_per_token(width: int, depth: int, vocab: int) -> int:
    """Hand count: 6 FLOPs per matmul weight per token (2 forward, 4 backward); an embedding lookup is no matmul."""
    return 6 * (depth * 2 * width * 4 * width + width * vocab)


@pytest.mark.slow
def test_a_module_outside_the_repository_sweeps_amp_x_ckpt(user_dir: Path) -> None:
    res = run_perfsweep(
        ["-m", "model=custom", "model._target_=usermodels.build", "model.ckpt_modules=[MyBlock]"]
        + ["+model.width=64", "+model.depth=4", *DATA, "batch=8", "seq_len=64", *FAST]
        + ["amp=true,false", "ckpt=true,false"],
        user_dir,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sqlite_rows(user_dir / "results.db", "SELECT * FROM runs ORDER BY job_num")
    assert [(r["amp"], r["ckpt"], r["status"]) for r in runs] == [
        (1, 1, "ok"),
        (1, 0, "ok"),
        (0, 1, "ok"),
        (0, 0, "ok"),
    ]
    for r in runs:
        assert r["model_name"] == "usermodels.build" and r["seq_len"] == 64
        assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 64)
        assert r["flops_method"] == "flop_counter"
        assert r["flops_per_token"] == pytest.approx(matmul_flops_per_token(64, 4, 512), rel=0.02)
        assert r["model_tflops_per_s"] > 0 and r["n_params"] > 0
        assert json.loads(r["config_json"])["model"]["width"] == 64  # the factory's own keys are stored
        stages = sqlite_rows(user_dir / "results.db", f"SELECT stage, cpu_time_ms FROM stages WHERE run_id = {r['id']}")
        assert {s["stage"] for s in stages} == {"data_to_device", "forward", "backward", "optimizer_step", "zero_grad"}
        assert all(s["cpu_time_ms"] > 0 for s in stages if s["stage"] in ("forward", "backward", "optimizer_step"))
    peak = {(r["amp"], r["ckpt"]): r["peak_allocated_bytes"] for r in runs}
    for amp in (0, 1):  # checkpointing each MyBlock keeps one input per block instead of its internals
        assert peak[(amp, 1)] < peak[(amp, 0)], peak
    assert "tokens/s" in res.stdout


@pytest.mark.slow
def test_a_user_model_compiles_with_its_blocks_checkpointed(user_dir: Path) -> None:
    """torch.compile over the checkpoint wrappers (wrapped first, compiled after, as torchtitan
    does), in a plain run; aot_eager compiles in seconds on CPU."""
    res = run_perfsweep(
        ["model=custom", "model._target_=usermodels.build", "model.ckpt_modules=[MyBlock]", "+model.width=32"]
        + [*DATA, "batch=4", "seq_len=16", "ckpt=true", "compile=true", "compile_backend=aot_eager", *FAST],
        user_dir,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (r,) = sqlite_rows(user_dir / "results.db", "SELECT * FROM runs")
    assert (r["status"], r["compile"], r["ckpt"], r["compile_cache"]) == ("ok", 1, 1, "isolated")
    assert r["compile_time_ms"] > 0 and r["n_recompiles"] is not None and r["flops_method"] == "flop_counter"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model._target_=nosuch_pkg.build"], "cannot import it (ModuleNotFoundError: No module named 'nosuch_pkg')"),
        (["model._target_=usermodels.not_a_module"], "returned dict, expected a torch.nn.Module"),
        (["model._target_=usermodels.logits_only"], "the forward must return a scalar loss tensor"),
        (["model._target_=usermodels.raises"], "the factory raised RuntimeError: weights file missing"),
        (["model._target_=usermodels.raises_its_own"], "the factory raised WeightsError: w.pt: truncated"),
        (["model._target_=usermodels.raises_bare"], "ImportError: (no message; raised at {dir}/usermodels.py:"),
        (["model._target_=usermodels.exits"], "checking the model on one batch ended its process (exit code 5)"),
        (["model._target_=usermodels.build", "ckpt=true"], "model.ckpt_modules=[]: ckpt=true"),
        (["model._target_=usermodels.build", "+model.widht=8"], "TypeError: build() got an unexpected keyword"),
        (["model.loss=cross_entropy"], "model._target_=None: must be a dotted path"),
        (["data=custom", "data._target_=usermodels.fixed_length"], "sequences of 12 positions but seq_len=16"),
        (["data=custom", "data._target_=usermodels.own_batches"], "a batch holds 3 samples but batch=2"),
        (["data=custom", "data._target_=usermodels.one_pass"], "returned a one-shot generator"),
    ],
    ids=[
        *("import-error", "not-a-module", "no-loss", "factory-raises", "own-exception", "bare-exception"),
        "process-exits",
        *("nothing-to-checkpoint", "bad-arg", "no-target"),
        *("data-ignores-seq-len", "data-ignores-batch", "one-shot-data"),
    ],
)
def test_bad_factories_are_refused_before_any_job(user_dir: Path, overrides: list[str], expected: str) -> None:
    model = [] if overrides[0].startswith("model") else ["model._target_=usermodels.build", "+model.vocab_size=100"]
    data = [] if overrides[0].startswith("data") else DATA
    res = run_perfsweep(["-m", "model=custom", *model, *overrides, *data, "batch=2", "seq_len=16", *FAST], user_dir)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert expected.format(dir=user_dir) in lines[0] and lines[0].endswith("no job was started"), lines[0]
    if "_target_=" in overrides[0]:
        assert overrides[0].split("=", 1)[1] in lines[0]  # names the factory
    assert not list(user_dir.glob("multirun/*/*/*_*"))  # no job folder


IMAGES = {"kind": "custom", "name": None, "_target_": "examples.cnn.images"}


def test_a_samples_model_refuses_seq_len_and_token_data() -> None:
    with pytest.raises(ConfigError, match=r"seq_len=64: must be null: model.unit=samples \(examples.cnn.build\)"):
        PerfsweepConfig(seq_len=64, model={"_target_": "examples.cnn.build", "unit": "samples"}, data=IMAGES)
    with pytest.raises(ConfigError, match=r"model.unit='samples': needs data from a factory \(data=custom"):
        PerfsweepConfig(seq_len=None, model={"_target_": "examples.cnn.build", "unit": "samples"})
    with pytest.raises(ConfigError, match=r"data._target_='examples.cnn.images': a data factory needs data=custom"):
        PerfsweepConfig(seq_len=None, model={"_target_": "a.build"}, data={"_target_": "examples.cnn.images"})
    with pytest.raises(ConfigError, match=r"data._target_=None: must be a dotted path .* \(data=custom needs one\)"):
        PerfsweepConfig(model={"_target_": "a.build"}, data={"kind": "custom", "name": None})
    with pytest.raises(ConfigError, match="seq_len=None: must be a positive integer"):
        PerfsweepConfig(seq_len=None, model={"_target_": "a.build"})


# --- the contract, in process: batches, losses, units -------------------------------------------


class Echo(torch.nn.Module):
    """Returns whatever ``out`` makes of its inputs: the forward's return types of real models."""

    def __init__(self, out) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same weights in every Echo
        self.w = torch.nn.Linear(4, 3)
        self.out = out

    def forward(self, x=None, **kw):
        x = kw.get("pixel_values", x)
        return self.out(self.w(x))


def test_losses_from_every_kind_of_output_and_batch() -> None:
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 1, 0])
    ce = torch.nn.functional.cross_entropy
    expected = float(ce(Echo(lambda z: z).w(x), y).detach())
    output = task.loss_function(ModelConfig(_target_="m.build"))
    predicted = task.loss_function(ModelConfig(_target_="m.build", loss=Loss.cross_entropy))
    # loss=output: a mapping with "loss" (a Hugging Face ModelOutput is one), an object with .loss
    assert float(output(Echo(lambda z: {"loss": ce(z, y)}), (x,)).detach()) == pytest.approx(expected)
    assert float(output(Echo(lambda z: type("Out", (), {"loss": ce(z, y)})()), x).detach()) == pytest.approx(expected)
    # loss=cross_entropy: (inputs, targets) or a dict with labels; logits as a tensor, .logits or a tuple's first
    assert float(predicted(Echo(lambda z: z), (x, y)).detach()) == pytest.approx(expected)
    assert float(predicted(Echo(lambda z: (z, None)), {"pixel_values": x, "labels": y}).detach()) == pytest.approx(
        expected
    )
    with pytest.raises(task.ContractError, match="returned a tuple"):
        output(Echo(lambda z: (z,)), x)
    with pytest.raises(task.ContractError, match=r"needs \(inputs, targets\)"):
        predicted(Echo(lambda z: z), x)
    assert task.units({"input_ids": torch.zeros(4, 16), "mask": torch.zeros(4, 16)}, Unit.tokens) == (64, 4)
    assert task.units((torch.zeros(8, 3, 32, 32), y), Unit.samples) == (None, 8)
    assert task.first_sample({"a": torch.zeros(4, 2), "b": [torch.zeros(4)]})["b"][0].shape == (1,)


# --- the shipped examples ----------------------------------------------------------------------


@pytest.mark.slow
def test_cnn_example_reports_samples_per_s(tmp_path: Path) -> None:
    res = run_perfsweep(
        ["-m", "-cd", str(REPO / "examples"), "-cn", "cnn", "amp=false", "ckpt=false", "batch=16"]
        + ["data.image_size=8,16", "data.n_samples=256", "model.width=8", "model.depth=2"]
        + [o for o in FAST if o != "report=false"],  # with the report
        tmp_path,
        env={"PYTHONPATH": str(REPO)},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sqlite_rows(tmp_path / "results.db", "SELECT * FROM runs ORDER BY job_num")
    assert [r["status"] for r in runs] == ["ok", "ok"]
    for r in runs:
        assert r["model_name"] == "small_cnn" and r["data_name"] == "synthetic_images"
        assert r["tokens_per_s"] is None and r["seq_len"] is None and r["flops_per_token"] is None
        assert r["samples_per_s"] == pytest.approx(16 * 3 / (r["measure_wall_ms"] / 1000))
        assert r["flops_method"] == "flop_counter" and r["flops_per_sample"] > 0
    assert "samples/s" in res.stdout and "tokens/s" not in res.stdout.split("Sweep 1")[1].split("Results:")[0]
    # the sweep varies a key of the data factory: the summary and the report tell the configs apart by it
    summary = res.stdout.split("Sweep 1")[1].split("Results:")[0]
    assert "data.image_size" in summary and "seq_len" not in summary
    report = (next(tmp_path.glob("multirun/*/*/report")) / "report.md").read_text()
    assert "| data.image_size |" in report and "samples/s" in report and "seq_len=nan" not in report
    verdicts = sqlite_rows(tmp_path / "results.db", "SELECT speedup_verdict FROM runs ORDER BY job_num")
    assert verdicts[0] == {"speedup_verdict": "baseline"} and verdicts[1]["speedup_verdict"] != "baseline"
    refused = run_perfsweep(["-cd", str(REPO / "examples"), "-cn", "cnn", "seq_len=64", *FAST], tmp_path)
    assert refused.returncode == 2 and "seq_len=64: must be null: model.unit=samples (small_cnn)" in refused.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason='transformers not installed: pip install -e ".[hf]"'
)
def test_hf_causal_lm_example_trains_a_llama_from_a_config(tmp_path: Path) -> None:
    res = run_perfsweep(
        ["-m", "-cd", str(REPO / "examples"), "-cn", "hf_causal_lm", "amp=false", "ckpt=true,false"]
        + ["model.ckpt_impl=torch,hf", "batch=4", "seq_len=64", "model.hidden_size=64", "model.layers=4"]
        + ["model.heads=2", "model.intermediate_size=256", "data.vocab_limit=2048", *FAST],
        tmp_path,
        env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sqlite_rows(tmp_path / "results.db", "SELECT * FROM runs ORDER BY job_num")
    assert [r["status"] for r in runs] == ["ok"] * 4
    hidden, layers, ffn, vocab = 64, 4, 256, 2048
    per_token = 6 * (layers * (4 * hidden * hidden + 3 * hidden * ffn) + hidden * vocab)
    for r in runs:
        assert r["model_name"] == "hf_llama_small" and r["vocab_size"] == vocab
        # HF's forward needs real values (mask checks): counted once on the job's first batch; the matmuls at
        # least (FlopCounterMode has no formula for every attention kernel: on CPU SDPA's is not counted)
        assert r["flops_method"] == "flop_counter" and per_token <= r["flops_per_token"] < 1.2 * per_token
    peak = {(json.loads(r["config_json"])["model"]["ckpt_impl"], r["ckpt"]): r["peak_allocated_bytes"] for r in runs}
    for impl in ("torch", "hf"):  # both ways of checkpointing the decoder layers lower the peak
        assert peak[(impl, 1)] < peak[(impl, 0)], peak


def test_examples_are_not_found_without_their_folder_on_the_path(tmp_path: Path) -> None:
    """The refusal a user gets when the launch directory does not hold the factory's package."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = run_perfsweep(["-cd", str(REPO / "examples"), "-cn", "cnn", *FAST], tmp_path, env=env)
    assert res.returncode == 2
    assert "data._target_='examples.cnn.images': cannot import it" in res.stderr  # the data is built first
    assert "importable from the launch directory or PYTHONPATH" in res.stderr


USER_DATA = """
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset


class Rows(Dataset):
    def __init__(self, n, width):
        self.x = torch.arange(n * width, dtype=torch.float32).view(n, width)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "labels": torch.tensor(i % 3)}


def rows(n=10, width=4, seed=None):
    assert seed is not None  # perfsweep passes the keys the signature names
    return Rows(n, width)


def loader(batch, n=10):
    return DataLoader(Rows(n, 4), batch_size=batch + 1)  # used as it is: its own batch size


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.ones(3, 2) * i for i in range(7))


def stream():
    return Stream()


def nothing():
    return [1, 2, 3]
"""


def test_data_factories_give_datasets_loaders_and_streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from perfsweep import data as data_mod
    from perfsweep.config import DataConfig

    (tmp_path / "userdata.py").write_text(textwrap.dedent(USER_DATA))
    monkeypatch.syspath_prepend(str(tmp_path))

    def batches(target: str, batch: int = 4, **args):
        return data_mod.loader(
            DataConfig(name=None, kind="custom", _target_=target, args=args), None, batch, None, 0, 7, False
        )

    first = next(iter(batches("userdata.rows", n=12)))  # a Dataset: batched here, dict batches kept
    assert first["features"].shape == (4, 4) and first["labels"].shape == (4,)
    assert len(list(batches("userdata.rows", n=12))) == 3  # drop_last, seeded shuffle
    # each sample's index is its first feature / 4: one epoch's order, twice
    orders = [[int(i) for b in batches("userdata.rows", n=12) for i in b["features"][:, 0] / 4] for _ in range(2)]
    assert orders[0] == orders[1]  # seeded: the same order each time
    assert sorted(orders[0]) == list(range(12)) and orders[0] != list(range(12))  # every sample once, shuffled
    assert next(iter(batches("userdata.loader")))["features"].shape == (5, 4)  # a DataLoader: as it is
    assert next(iter(batches("userdata.stream", batch=2))).shape == (2, 3, 2)  # an IterableDataset: batched
    assert len(list(batches("userdata.stream", batch=2))) == 3  # whole batches only: 7 items, batch 2
    moved = task.to_device({"a": first["features"], "b": [first["labels"]]}, "meta")
    assert moved["a"].device.type == "meta" and moved["b"][0].device.type == "meta"
    with pytest.raises(task.ContractError, match=r"holds 2 samples, fewer than one batch"):
        batches("userdata.rows", n=2)
    with pytest.raises(
        task.ContractError, match=r"a batch is a int; expected a tensor, a tuple/list of tensors or a dict"
    ):
        task.units(next(iter(batches("userdata.nothing"))), Unit.samples)  # an iterable is used as it is


def test_namedtuple_batches_and_a_factory_s_own_path_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import namedtuple

    from perfsweep.config import to_plain_dict, to_run_config

    Sample = namedtuple("Sample", "x y")
    batch = Sample(torch.zeros(4, 3), torch.ones(4))
    moved, one = task.to_device(batch, "meta"), task.first_sample(batch)
    assert isinstance(moved, Sample) and moved.x.device.type == "meta" and one.y.shape == (1,)
    # data=custom: keys the built-in corpora also have (path, glob) are the factory's, and round-trip
    cfg = PerfsweepConfig(
        seq_len=None,
        model={"_target_": "examples.cnn.build", "unit": "samples"},
        data={"kind": "custom", "name": None, "_target_": "my.data", "path": "/x", "glob": "*.png"},
    )
    assert cfg.data.args == {"path": "/x", "glob": "*.png"} and cfg.data.path is None
    plain = to_plain_dict(cfg)
    assert plain["data"] == {"_target_": "my.data", "name": None, "kind": "custom", "path": "/x", "glob": "*.png"}
    assert to_plain_dict(to_run_config(plain)) == plain


def test_gpt_ckpt_modules_are_checked_against_its_submodules() -> None:
    from perfsweep.preflight import _check_gpt_ckpt_modules

    _check_gpt_ckpt_modules(["Block"])
    _check_gpt_ckpt_modules(["LayerNorm"])  # a submodule class, even if not perfsweep's own
    with pytest.raises(ConfigError, match=r"model.ckpt_modules=\['GPT'\]: ckpt=true with perfsweep's GPT"):
        _check_gpt_ckpt_modules(["GPT"])  # the root is never wrapped


def test_the_console_script_imports_from_the_launch_directory(user_dir: Path) -> None:
    import subprocess
    import sys

    script = Path(sys.executable).parent / "perfsweep"
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable} (perfsweep not pip-installed here)")
    res = subprocess.run(
        [str(script), "model=custom", "model._target_=usermodels.not_a_module", *DATA, "batch=2", "seq_len=16", *FAST],
        cwd=user_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2 and "returned dict, expected a torch.nn.Module" in res.stderr, res.stderr[-2000:]


@pytest.mark.slow
def test_a_job_that_dies_without_a_word_is_failed_with_its_exit_code(user_dir: Path) -> None:
    """Not interrupted (nobody pressed Ctrl-C), not stopped by perfsweep: the exit code is the news."""
    res = run_perfsweep(["model=custom", "model._target_=usermodels.dies_in_the_job", *DATA, *FAST], user_dir)
    assert res.returncode == 1, res.stderr[-3000:]
    (run,) = sqlite_rows(user_dir / "results.db", "SELECT status, error FROM runs")
    assert run == {"status": "failed", "error": "job process exited with code 3 without reporting a result"}


def test_an_oom_in_the_profiled_window_keeps_the_run_ok_without_a_profile(user_dir: Path) -> None:
    """The window runs after the measured steps: a run that trained them fits, whatever the
    profiler's own memory; batch=max's answer must not depend on profile.enabled."""
    res = run_perfsweep(
        ["-m", "model=custom", "model._target_=usermodels.profiler_hungry", *DATA, "batch=4", "seq_len=16"]
        + [o for o in FAST if o != "report=false"],
        user_dir,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = sqlite_rows(user_dir / "results.db", "SELECT * FROM runs")
    assert run["status"] == "ok" and run["error"] is None and run["tokens_per_s"] > 0
    assert run["profile_error"].startswith("not profiled: the profiled window ran out of memory after the measured")
    assert "DefaultCPUAllocator" in run["profile_error"] and "profile.record_shapes=false" in run["profile_error"]
    assert run["peak_allocated_bytes"] > 0  # the memory step ran before the window
    for table in ("stages", "ops", "kernels"):
        assert sqlite_rows(user_dir / "results.db", f"SELECT * FROM {table}") == []
    phases = sqlite_rows(user_dir / "results.db", "SELECT phase, COUNT(*) AS n FROM steps GROUP BY phase")
    assert {p["phase"]: p["n"] for p in phases} == {"warmup": 1, "measure": 3, "memory": 1}
    assert "not profiled: the profiled window ran out of memory" in res.stdout
    md = next(user_dir.glob("multirun/*/*/report/report.md")).read_text()
    assert "not profiled: its profiled window ran out of memory" in md
