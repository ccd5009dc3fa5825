"""Every mistake is answered before any job starts: one line on stderr naming the key and the
value, exit code 2, nothing written to the database, in a plain run and in a multirun alike."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
import torch

from perfsweep import store
from tests.util import TINY, read_only, run_perfsweep, run_row


def counts(db: Path) -> tuple[int, int]:
    """Sweeps and runs as a reader sees them, rows still in the write-ahead log included (perfsweep
    writes in WAL mode and its processes leave by os._exit, so a stray write may never reach the
    main file: ``immutable=1`` read past it). Read from a copy, so no -wal/-shm appears beside ``db``."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / db.name
        shutil.copy(db, copy)
        if (wal := db.with_name(db.name + "-wal")).exists():
            shutil.copy(wal, copy.with_name(copy.name + "-wal"))
        con = sqlite3.connect(copy)
        try:
            return con.execute("SELECT count(*) FROM sweeps").fetchone()[0], con.execute(
                "SELECT count(*) FROM runs"
            ).fetchone()[0]
        finally:
            con.close()


@pytest.fixture
def seeded_db(tmp_path: Path) -> Path:
    """A results.db that already holds one sweep and one run, to show that nothing is added."""
    db = tmp_path / "results.db"
    engine = store.connect(f"sqlite:///{db}")
    sid = store.get_or_create_sweep(engine, "/earlier/sweep", "earlier")
    store.save_run(engine, run_row(sid))
    engine.dispose()
    return db


# (overrides, text that must appear in the one line). Each case is also run with -m and a grid.
CASES = {
    "device_cuda_without_cuda": (["device=cuda"], "device='cuda'"),
    "fp16_without_cuda": (["amp=true", "amp_dtype=fp16"], "amp_dtype='fp16'"),
    "events_timing_without_cuda": (["timing=events"], "timing='events'"),
    "repeat_zero": (["repeat=0"], "repeat=0"),
    "seed_negative": (["seed=-1"], "seed=-1"),  # was blamed on data.synthetic_tokens (numpy's error)
    "gpus_per_job_on_cpu": (["launcher.gpus_per_job=1", "device=cpu"], "launcher.gpus_per_job=1"),
    "start_method_unknown": (["launcher.start_method=fork"], "launcher.start_method=fork"),
    "lr_not_number": (["lr=fast"], "lr=fast"),
    "dropout_not_number": (["model.dropout=high"], "model.dropout='high'"),  # a preset's free-form args
    "data_path_missing": (["data=textfile", "data.path={tmp}/no/such/file.txt"], "data.path='{tmp}/no/such/file.txt'"),
    "data_path_not_a_file": (["data=textfile", "data.path=/dev/null"], "data.path='/dev/null'"),  # was "no such file"
    "data_path_empty_file": (["data=textfile", "data.path={tmp}/empty.txt"], "data.path='{tmp}/empty.txt'"),
    "data_path_empty_folder": (["data=textfile", "data.path={tmp}/nodocs"], "data.path='{tmp}/nodocs'"),
    "data_shorter_than_a_batch": (["data=textfile", "data.path={tmp}/short.txt"], "data.path='{tmp}/short.txt'"),
    "synthetic_shorter_than_a_batch": (["data.synthetic_tokens=100"], "data.synthetic_tokens=100"),
    "model_preset_typo": (["model=tinny"], "model=tinny"),
    "data_preset_typo": (["data=synthetc"], "data=synthetc"),
    "not_a_bool": (["amp=maybe"], "amp=maybe"),
    # Hydra read these as true: -m compile=1,2 ran one config twice, each a cold compile
    "bool_spelled_yes": (["amp=yes"], "amp=yes"),
    "bool_as_a_number": (["compile=1"], "compile=1"),
    "bool_list_for_a_sweep": (["amp=[true,false]"], "amp=[true,false]"),  # was echoed as amp=[true,false
    # Hydra took the last: -m batch=8,16 batch=4 ran batch=4 alone, and said nothing of the grid
    "key_given_twice": (["batch=8,16", "batch=4"], "batch is given twice (batch=8,16 and batch=4)"),
    # a space after the comma: Hydra's grammar error named neither the override nor the cause
    "space_after_a_comma": (["amp=true,", "false"], "'amp=true,' ends in a comma"),
    # Hydra's grammar error named neither the key nor the value ("mismatched input '=' expecting
    # <EOF>"): a folder with '=' in its name (a job folder's) as typed
    "path_holding_grammar": (["hydra.sweep.dir={tmp}/a=b"], "hydra.sweep.dir={tmp}/a=b: cannot be read as an override"),
    "unclosed_quote": (["lr='a"], "lr='a: cannot be read as an override (an unclosed quote)"),
    "db_url_unparsable": (["db.url=bogus"], "db.url='bogus'"),
    "db_file_read_only": (["db.url=sqlite:///{tmp}/results.db"], "db.url='sqlite:///{tmp}/results.db'"),
    "db_folder_read_only": (["db.url=sqlite:///{tmp}/ro/results.db"], "db.url='sqlite:///{tmp}/ro/results.db'"),
    "db_in_memory": (["db.url=sqlite:///"], "db.url='sqlite:///'"),
    "db_url_a_folder": (["db.url=sqlite:///{tmp}/nodocs"], "db.url='sqlite:///{tmp}/nodocs'"),  # "must be writable"
    "key_typo": (["bach=4"], "bach"),
    # Hydra's error echoes the override as typed: the password was printed in full
    "key_typo_holding_a_password": (["db.ur=postgresql://me:s3cretPW@h/db"], "db.ur=postgresql://me:***@h/db"),
    # a preset's keys: Hydra's own answer was "use +model.n_layer=2", which only moved the mistake
    "model_key_typo": (["model.n_layer=2"], "model.n_layer=2"),
    "data_key_typo": (["data.vocab_limt=100"], "data.vocab_limt=100"),
    # a key of another preset: Hydra's answer led to "did you mean data.path?" for data.path itself
    "key_of_another_preset": (["data.path=/x"], "data.path=/x"),
    # ...and with + it was added, then ignored: the job trained on the preset's own data
    "added_key_of_another_kind": (["+data.glob=*.md"], "data.glob='*.md'"),
    # the data node is untyped in the schema: this was Python's TypeError ("'>=' not supported")
    "data_value_of_wrong_type": (["data.synthetic_vocab=abc"], "data.synthetic_vocab='abc'"),
    # was blamed on data.synthetic_tokens, the key that names the data
    "token_cache_unwritable": (["data.cache_dir={tmp}/afile/cache"], "data.cache_dir='{tmp}/afile/cache'"),
    # every compile=true job failed at its compile with InvalidBackend, after the sweep had started
    "compile_backend_unknown": (["compile=true", "compile_backend=nope"], "compile_backend='nope'"),
    # OmegaConf's "int is not a subclass of StepsConfig" named a class, not the keys to set
    "group_given_a_value": (["steps=5"], "steps=5"),
}
HINTS = {  # what is allowed or what to do, beyond naming key and value
    "device_cuda_without_cuda": "device=cpu",
    "events_timing_without_cuda": "timing=sync",
    "repeat_zero": "positive integer",
    "seed_negative": "from 0 to 2**64-1",
    "gpus_per_job_on_cpu": "the jobs run on CPU (device=cpu)",
    "lr_not_number": "must be a number",
    "dropout_not_number": "must be a number",
    "model_preset_typo": "did you mean model=tiny?",
    "data_preset_typo": "did you mean data=synthetic?",
    "data_shorter_than_a_batch": "fewer than one batch",
    "data_path_not_a_file": "not a regular file or a folder",
    "not_a_bool": "must be true or false",
    "bool_spelled_yes": "must be true or false",
    "bool_as_a_number": "must be true or false",
    "bool_list_for_a_sweep": "one job per value is a sweep: -m amp=true,false",
    "key_given_twice": "give each key once, its values as one list (batch=8,16,4)",
    "space_after_a_comma": "(amp=true,false)",
    "db_file_read_only": "readonly",
    "path_holding_grammar": "quote a path or URL that holds = , spaces or brackets: hydra.sweep.dir='{tmp}/a=b'",
    "unclosed_quote": "override_grammar",
    "db_folder_read_only": "writable",
    "db_url_a_folder": "nodocs is a folder, not a database file: name a file in it, e.g. sqlite:///{tmp}/nodocs/results.db",
    "key_typo": "did you mean batch?",
    "key_typo_holding_a_password": "did you mean db.url?",
    "db_url_unparsable": "db.url=sqlite:///",  # a path (--db's form) is shown as the URL it would be
    "model_key_typo": "did you mean model.n_layers?",
    "data_key_typo": "did you mean data.vocab_limit?",
    "key_of_another_preset": "data=textfile has it: add data=textfile",
    "added_key_of_another_kind": "only data.kind=textfile reads it",
    "data_value_of_wrong_type": "must be an integer",
    "token_cache_unwritable": "cannot write the token cache there",
    "compile_backend_unknown": "allowed: aot_eager,",
    "group_given_a_value": "steps is a group of settings; set one of them: steps.max_warmup,",
}


# A plain run goes another way than a multirun (perfsweep.__main__.hydra_main, not the sweeper) to
# the same checks, and removes the run folder Hydra made for it. Each check is run that way too,
# once, with the first of its cases here: every case in both ways took 167 s of the suite's CPU
# on the 2-core VM, a refusal that imports torch 2.5 CPU-s.
PLAIN_RUN = (
    "device_cuda_without_cuda",  # check_device
    "repeat_zero",  # the schema (to_run_config)
    "dropout_not_number",  # a preset's free-form arguments
    "gpus_per_job_on_cpu",  # placements
    "data_path_missing",  # check_data: the text
    "data_shorter_than_a_batch",  # check_data: the tokens
    "token_cache_unwritable",  # check_data: the cache
    "data_value_of_wrong_type",  # the untyped data node
    "compile_backend_unknown",  # check_compile_backends, with torch
    "model_preset_typo",  # Hydra's composition (error_line)
    "key_typo_holding_a_password",  # ...with a password hidden
    "added_key_of_another_kind",  # data_keys_read
    "key_given_twice",  # override_problem, before Hydra
    "db_url_unparsable",  # reserve_sweep
    "db_file_read_only",  # ...a file it cannot write
)


@pytest.mark.parametrize(
    ("case", "mode"),
    [(case, "multirun") for case in CASES] + [(case, "run") for case in PLAIN_RUN],
)
def test_mistake_is_one_line_exit_2_and_writes_nothing(case: str, mode: str, tmp_path: Path, seeded_db: Path):
    if case in ("device_cuda_without_cuda", "fp16_without_cuda", "events_timing_without_cuda") and (
        torch.cuda.is_available()
    ):
        pytest.skip("CUDA is available here, so this is valid input")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("a few words only")
    (tmp_path / "nodocs").mkdir()
    (tmp_path / "afile").write_text("")
    (tmp_path / "ro").mkdir()
    shutil.copy(seeded_db, tmp_path / "ro" / "results.db")
    overrides = [o.format(tmp=tmp_path) for o in CASES[case][0]]
    needle = CASES[case][1].format(tmp=tmp_path)
    grid = [] if mode == "run" else ["steps.measure=2,3"]
    base = [o for o in TINY if not any(o.startswith(k.split("=")[0] + "=") for k in [*overrides, *grid])]
    # on the CPU unless the case is about the device: with the default device=auto, a GPU machine
    # asks torch's CUDA build for its GPUs before most of these refusals (7 s each on an H200
    # machine, against 1.3 s here; the order is test_a_mistake_in_the_data_or_the_db_url_...'s)
    base += [] if any(o.startswith("device=") for o in overrides) else ["device=cpu"]
    args = [*base, *overrides] if mode == "run" else ["-m", *grid, *base, *overrides]
    guard: contextlib.AbstractContextManager = contextlib.nullcontext()
    if case == "db_file_read_only":
        guard = read_only(seeded_db)
    elif case == "db_folder_read_only":
        guard = read_only(tmp_path / "ro")
    before = counts(seeded_db), counts(tmp_path / "ro" / "results.db")
    with guard:
        res = run_perfsweep(args, tmp_path, timeout=180)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(lines) == 1, res.stderr[-2000:]
    assert lines[0].startswith("perfsweep: ") and needle in lines[0] and "no job was started" in lines[0], lines[0]
    if case in HINTS:
        assert HINTS[case].format(tmp=tmp_path) in lines[0], lines[0]
    assert (counts(seeded_db), counts(tmp_path / "ro" / "results.db")) == before
    assert not list(tmp_path.glob("multirun/*/*/0_*")), "a job folder was created"
    assert not (tmp_path / "outputs").exists(), "a plain run's folder (or the outputs/ made for it) was left behind"


def test_a_refused_plain_run_removes_only_what_hydra_made(tmp_path: Path):
    """Hydra makes a plain run's folder, with its files in it, before perfsweep's checks: a refusal
    removes them, and nothing that was there before. An empty folder of the user's given as
    hydra.run.dir was taken for Hydra's and removed with its parent; the launch directory given
    (hydra.run.dir=.) kept Hydra's files."""
    refused = [*TINY, "db.url=sqlite://"]  # an in-memory database: refused as the run's row is written
    (tmp_path / "mine" / "run").mkdir(parents=True)
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "notes.txt").write_text("mine")
    for cwd, where in ((tmp_path, [f"hydra.run.dir={tmp_path}/mine/run"]), (tmp_path / "here", ["hydra.run.dir=."])):
        res = run_perfsweep([*refused, *where], cwd)
        assert res.returncode == 2 and "an in-memory SQLite database" in res.stderr, res.stderr[-2000:]
    assert (tmp_path / "mine" / "run").is_dir() and not list((tmp_path / "mine" / "run").iterdir())
    assert os.listdir(tmp_path / "here") == ["notes.txt"]
    # through a symlink, and up from the launch directory: what Hydra made goes all the same
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for cwd, where in ((tmp_path, f"hydra.run.dir={tmp_path}/link/new"), (tmp_path / "here", "hydra.run.dir=../up/x")):
        res = run_perfsweep([*refused, where], cwd)
        assert res.returncode == 2 and "an in-memory SQLite database" in res.stderr, res.stderr[-2000:]
    assert os.listdir(tmp_path / "real") == [] and not (tmp_path / "up").exists()
    res = run_perfsweep(refused, tmp_path)  # the default folder, outputs/<date>/<time>: made by Hydra, gone
    assert res.returncode == 2 and not (tmp_path / "outputs").exists(), res.stderr[-2000:]


def test_an_empty_grid_is_refused_in_one_line(tmp_path: Path):
    """A range with no values (Hydra's range(4,0)) gives no grid point: it once ended in an IndexError."""
    res = run_perfsweep(["-m", "batch=range(4,0)", *[o for o in TINY if not o.startswith("batch=")]], tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip() == (
        f"perfsweep: the grid is empty: no grid point in batch=range(4,0) "
        f"{' '.join(o for o in TINY if not o.startswith('batch='))}; check its ranges; no job was started"
    )
    assert not (tmp_path / "results.db").exists() and not (tmp_path / "multirun").exists()


def test_resume_leaves_a_file_that_is_not_a_results_database_as_it_was(tmp_path: Path, capsys):
    """An empty file was given perfsweep's schema (0 -> 114,688 bytes), then told it held no sweep."""
    from perfsweep.resume import main as resume_main

    empty = tmp_path / "empty.db"
    empty.touch()
    assert resume_main(["1", "--db", str(empty)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"perfsweep resume: --db {empty}: not a perfsweep results database (no schema version)"
    )
    assert empty.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


def test_resume_names_the_sweeps_there_are(tmp_path: Path, capsys):
    """SWEEP is an id or a name, as report's --sweep; an unknown one lists what the database holds."""
    from perfsweep import store
    from perfsweep.resume import main as resume_main

    db = tmp_path / "results.db"
    engine = store.connect(f"sqlite:///{db}")
    store.end_sweep(engine, store.get_or_create_sweep(engine, str(tmp_path / "s"), "grid"), "interrupted")
    engine.dispose()
    for spec, said in (
        ("7", "SWEEP 7: no sweep with id 7 (latest ids: 1)"),
        ("gird", "SWEEP gird: no sweep with that id or name (names: grid)"),
    ):
        assert resume_main([spec, "--db", str(db)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"perfsweep resume: {said}; list them with: perfsweep query") and "\n" not in err
    # found by name; its folder was moved away: said before anything runs (Hydra's refusal named this command)
    assert resume_main(["grid", "--db", str(db)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"perfsweep resume: sweep 1's folder {tmp_path / 's'} is gone (moved or deleted), and its jobs go back "
        "into it; move it back, or run the sweep's command again for a new sweep"
    )
    # --close runs no job, so the folder does not matter, but a sweep without a run is not closed
    assert resume_main(["grid", "--db", str(db), "--close"]) == 2
    assert "1 grid point did not finish (interrupted or never started); run it with: perfsweep resume 1" in (
        capsys.readouterr().err
    )


def test_a_sweep_folder_that_cannot_be_made_is_one_line(tmp_path: Path):
    """A launch directory nobody may write to (a full disk says the same): it was a traceback."""
    (tmp_path / "ro").mkdir()
    with read_only(tmp_path / "ro"):
        res = run_perfsweep(
            ["-m", "amp=true,false", "device=cpu", *TINY, f"db.url=sqlite:///{tmp_path}/r.db"], tmp_path / "ro"
        )
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr[-2000:]
    assert res.stderr.startswith(f"perfsweep: hydra.sweep.dir={tmp_path / 'ro'}/multirun/")
    assert ": cannot create the sweep's folder (" in res.stderr and "no job was started" in res.stderr
    # a file where the folder, or one above it, would be: it was a traceback (NotADirectoryError)
    (tmp_path / "afile").write_text("")
    for where in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        res = run_perfsweep(["-m", "amp=true,false", "device=cpu", *TINY, f"hydra.sweep.dir={where}"], tmp_path)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr[-2000:]
        assert res.stderr.startswith(f"perfsweep: hydra.sweep.dir={where}: cannot create the sweep's folder (")
        assert "a file stands where the folder, or one above it, would be" in res.stderr
    assert (tmp_path / "afile").read_text() == "" and not (tmp_path / "results.db").exists()


def test_a_run_folder_that_cannot_be_made_or_written_is_one_line(tmp_path: Path):
    """A plain run (no -m): Hydra makes and writes its folder before perfsweep's code runs, and a
    folder it could not make (the default, under outputs/) or write (its log file) was a traceback."""
    (tmp_path / "ro").mkdir()
    db = f"db.url=sqlite:///{tmp_path}/r.db"
    with read_only(tmp_path / "ro"):
        made = run_perfsweep([*TINY, db], tmp_path / "ro")
        written = run_perfsweep([*TINY, db, f"hydra.run.dir={tmp_path}/ro"], tmp_path)
    for res, what in ((made, ": outputs)"), (written, f": {tmp_path}/ro/__main__.log)")):
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr[-2000:]
        assert res.stderr.startswith("perfsweep: cannot write the run's folder ") and "no job was started" in res.stderr
        assert what in res.stderr and "hydra.run.dir" in res.stderr
    assert f"folder {tmp_path}/ro/outputs/" in made.stderr and f"folder {tmp_path}/ro (" in written.stderr
    assert not (tmp_path / "r.db").exists() and os.listdir(tmp_path / "ro") == []


def test_resume_needs_a_multirun_and_a_sweep_folder(tmp_path: Path):
    res = run_perfsweep([*TINY, "resume=true"], tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "resume=true" in res.stderr
    res = run_perfsweep(["-m", *TINY, "resume=true", f"hydra.sweep.dir={tmp_path}/nothing-here"], tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and ".perfsweep-sweep not found" in res.stderr
    assert not (tmp_path / "results.db").exists()


def test_help_lists_presets_only_and_cfg_with_multirun_is_one_line(tmp_path: Path):
    res = run_perfsweep(["--help"], tmp_path)
    assert res.returncode == 0
    choices = [ln for ln in res.stdout.splitlines() if ln.startswith(("model: ", "data: "))]
    assert sorted(choices) == [
        "data: custom, stdlib, synthetic, textfile",
        "model: custom, gpt2_small, minigpt_seed, small, tiny",
    ]
    assert "perfsweep query SQL | report | trace FILE | resume SWEEP | import FOLDER | upgrade" in res.stdout
    res = run_perfsweep(["-m", "--cfg", "job", "amp=true,false"], tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "--cfg" in res.stderr
    # -m between overrides: Hydra's parser printed its usage and "unrecognized arguments"; it is
    # taken as where Hydra wants it, so the sweep's own checks answer (ckpt=maybe, in one line)
    res = run_perfsweep(["amp=true,false", "-m", "ckpt=maybe"], tmp_path)
    assert res.returncode == 2 and res.stderr.strip().startswith("perfsweep: ckpt=maybe: must be true or false")
    assert res.stderr.strip().splitlines() == [res.stderr.strip()], res.stderr


def test_a_plain_run_does_not_reuse_another_runs_folder(tmp_path: Path):
    first = run_perfsweep([*TINY, "profile.enabled=false", "device=cpu", f"hydra.run.dir={tmp_path}/mine"], tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = counts(tmp_path / "results.db")
    again = run_perfsweep([*TINY, "profile.enabled=false", "device=cpu", f"hydra.run.dir={tmp_path}/mine"], tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert "hydra.run.dir=" in again.stderr and "already holds another sweep" in again.stderr
    assert counts(tmp_path / "results.db") == before
    assert (tmp_path / "mine" / ".hydra").is_dir()  # the first run's folder is kept as it was
    assert "resume=true" not in again.stderr  # a plain run is not resumed: it was told to, then refused
    # its folder removed, the run's row still names it: refused, not added to that run's sweep, and
    # the folder handed back (kept and marked, each message sent the user to the other)
    shutil.rmtree(tmp_path / "mine")
    removed = run_perfsweep([*TINY, "profile.enabled=false", "device=cpu", f"hydra.run.dir={tmp_path}/mine"], tmp_path)
    assert removed.returncode == 2 and removed.stderr.count("\n") == 1, removed.stderr
    assert (
        f"hydra.run.dir={tmp_path}/mine: db.url=" in removed.stderr and "holds run 1 of this folder" in removed.stderr
    )
    assert "give this run another hydra.run.dir" in removed.stderr and "resume" not in removed.stderr
    assert counts(tmp_path / "results.db") == before and not (tmp_path / "mine").exists()


@pytest.mark.parametrize(
    ("mode", "mistake"), [("multirun", "data"), ("run", "data"), ("multirun", "db_url"), ("run", "db_dialect")]
)
def test_a_mistake_in_the_data_or_the_db_url_is_answered_before_torch_is_asked_for_a_gpu(
    mode: str, mistake: str, tmp_path: Path
):
    """Asking torch whether it sees a GPU (the device's check, the placements') imports it on a
    CUDA build and starts CUDA's driver (perfsweep.preflight.check_all: 1.1 s more for this refusal
    on the 2-core VM with a stand-in CUDA build; on an H200 machine, 2026-11-28, a refusal after it
    took 7 s against 3.5 s before it). The data's checks and what the database URL says alone (an
    in-memory database, a dialect SQLAlchemy lacks) need no torch, so they come first: that is what
    is refused, though device=cuda is refused too where torch sees no GPU, and the command imports
    no torch for it. On a CPU build torch is never imported for the question; the order is what
    fails here on the old code."""
    grid = ["-m", "seed=0,1"] if mode == "multirun" else []
    base = [o for o in TINY if not o.startswith("data=")]
    missing = tmp_path / "no" / "such.txt"
    wrong, needle = {
        "data": (["data=textfile", f"data.path={missing}"], f"data.path='{missing}'"),
        "db_url": (["data=synthetic", "db.url=sqlite://"], "an in-memory SQLite database"),
        "db_dialect": (["data=synthetic", "db.url=nosuch+driver://me@host/db"], "Can't load plugin"),
    }[mistake]
    res = run_perfsweep(
        [*grid, *base, "device=cuda", *wrong],
        tmp_path,
        env={"PYTHONPROFILEIMPORTTIME": "1"},  # each import as "import time: self | cumulative | name" on stderr
    )
    timed = [line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")]
    said = [line for line in res.stderr.splitlines() if line.strip() and not line.startswith("import time:")]
    assert res.returncode == 2 and len(said) == 1, res.stderr[-2000:]
    assert needle in said[0] and "no job was started" in said[0], said[0]
    assert "hydra" in timed and "torch" not in timed  # the import lines are there, torch's is not
    assert not list(tmp_path.glob("*.db")) and not (tmp_path / "outputs").exists()  # nothing made, nothing left


def test_what_a_db_url_says_alone_is_refused_with_its_password_hidden():
    """preflight.check_db_url, in-process: a scheme typed with one '/' was offered as a SQLite
    file's name (its password shown twice); a dialect SQLAlchemy lacks showed a password that
    holds a '/' or a space."""
    from perfsweep.preflight import ConfigError, check_db_url

    for url, said in (
        ("postgresql:/u:s3cret@h/db", "db.url='postgresql:/u:***@h/db': Could not parse"),
        ("nosuch://u:Top/Secret 9@h/db", "db.url='nosuch://u:***@h/db': Can't load plugin"),
        ("results.db", "a SQLite file is given as a URL: db.url=sqlite:///"),  # a path: the hint stays
        ("sqlite+pysqlite://", "an in-memory SQLite database"),
        # a bare '@' in the password: SQLAlchemy read 'p' as it and failed on "port 'w0rd@h'"
        ("postgresql://u:p@ss:s3cret@h/db", "db.url='postgresql://u:***@h/db': it holds '@' more than once"),
    ):
        with pytest.raises(ConfigError) as refused:
            check_db_url(url)
        assert said in str(refused.value) and "s3cret" not in str(refused.value), str(refused.value)
        assert "Secret" not in str(refused.value) and ("sqlite:///" in said) == ("SQLite file" in str(refused.value))
    for url in (
        "sqlite:///x.db",
        "sqlite:////abs/x.db",
        "sqlite+pysqlite:///x.db?timeout=5",
        "sqlite:////data/me@host/run@v2.db",  # no user: a path's '@'s are its own
        "postgresql://u:p@h/db",
        "postgresql://u:p%40ss@h/db?application_name=me@box",  # an '@' written %40, one in the query
        "postgresql://user@server:pw@h/db",  # a user name's '@' (Azure's): SQLAlchemy reads it so
    ):
        check_db_url(url)  # valid: nothing touched, nothing said
    # a driver that is not installed: said here, before torch, not as the database is opened
    import importlib.util

    absent = [d for d in ("pg8000", "pymysql", "asyncpg", "oracledb") if importlib.util.find_spec(d) is None]
    if not absent:
        pytest.skip("every driver this test would name is installed here")
    scheme = {"pg8000": "postgresql+pg8000", "pymysql": "mysql+pymysql", "asyncpg": "postgresql+asyncpg"}
    with pytest.raises(ConfigError, match=f"its driver is not installed .*'{absent[0]}'") as refused:
        check_db_url(f"{scheme.get(absent[0], 'oracle+oracledb')}://u:s3cret@h/db")
    assert "s3cret" not in str(refused.value)


def test_a_mistaken_setting_is_answered_before_the_corpus_is_tokenized(tmp_path: Path):
    """Tokenizing a corpus not yet in the token cache is the longest of the checks (minutes for
    gigabytes), so a setting refused without tokens (more threads than a job's cores) is answered
    before it, in one line, and nothing goes into the cache. A review found it tokenized first
    when the data's checks moved ahead of torch's question: 5.45 s and a "tokenizing" line for a
    28 MB corpus, against 1.03 s."""
    (tmp_path / "corpus.txt").write_text("some words of a corpus, never tokenized here\n" * 2000)
    cache = tmp_path / "token-cache"
    res = run_perfsweep(
        ["-m", "seed=0,1", "model=tiny", "data=textfile", "data.path=corpus.txt", f"data.cache_dir={cache}"]
        + ["launcher.parallel=2", "threads=100000", "device=cpu", "report=false"],
        tmp_path,
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "threads=100000" in lines[0], res.stderr[-2000:]
    assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))


def test_more_threads_than_a_lone_job_has_cores_is_said_and_run(tmp_path: Path):
    """One job at a time, one rank: threads above its cores are allowed (one may mean to measure
    that), but said before the job starts; the job runs them and stores how many."""
    from perfsweep import slots
    from tests.util import sqlite_rows

    threads = len(slots.allowed_cpus()) + 1
    res = run_perfsweep(["-m", f"threads={threads}", "device=cpu", *TINY], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    said = [line for line in res.stderr.splitlines() if f"threads={threads}" in line and "core(s)" in line]
    assert len(said) == 1 and f"more than the {threads - 1} CPU core(s) a job may use here" in said[0], res.stderr
    assert res.stderr.index(said[0]) < res.stderr.index("[1/1]")  # before the job
    (run,) = sqlite_rows(tmp_path / "results.db", "SELECT status, torch_threads FROM runs")
    assert (run["status"], run["torch_threads"]) == ("ok", threads)
    # a plain run says it too, of the cores the job is allotted: fewer under SLURM_CPUS_PER_TASK
    plain = run_perfsweep(["threads=2", "device=cpu", *TINY], tmp_path, env={"SLURM_CPUS_PER_TASK": "1"})
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "threads=2 is more than the 1 CPU core(s) a job may use here" in plain.stderr, plain.stderr[-2000:]
    quiet = run_perfsweep([f"threads={threads - 1}", "device=cpu", *TINY], tmp_path)  # within: nothing said
    assert quiet.returncode == 0 and "core(s) a job may use" not in quiet.stderr, quiet.stderr[-2000:]


# report=true,false: the line echoed the values sorted (report=false,true), not as typed. db.url: the
# sweep's row is in one database, and the job given another failed its write mid-sweep (exit 1)
@pytest.mark.parametrize(
    ("grid", "shown"),
    [
        (["repeat=1,2"], "repeat=1,2"),
        (["order=grid,shuffle"], "order=grid,shuffle"),
        (["report=true,false"], "report=true,false"),
        (
            ["db.url=sqlite:///A.db,sqlite:///a.db,postgresql://u:s3cret@h/db"],
            "A.db,sqlite:///a.db,postgresql://u:***@",
        ),
    ],
)
def test_how_the_sweep_runs_is_not_a_grid_axis(grid: list[str], shown: str, tmp_path: Path):
    res = run_perfsweep(["-m", *grid, *(o for o in TINY if o != "report=false")], tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert shown in lines[0] and "one value for the whole sweep" in lines[0] and "s3cret" not in lines[0], lines[0]
    assert not list(tmp_path.glob("multirun/*/*/.perfsweep-sweep"))  # no folder claimed
    assert not (tmp_path / "results.db").exists()


def test_order_needs_a_multirun(tmp_path: Path):
    res = run_perfsweep(["order=shuffle", *TINY], tmp_path)
    assert res.returncode == 2 and "order=shuffle" in res.stderr and "add -m" in res.stderr


def test_a_plain_run_given_several_values_is_told_to_add_m(tmp_path: Path):
    """Hydra's answer ran its three numbered options into one line, "use key=[value1,value2]"
    first: for amp, a list is no setting at all. The sweep comes first now, in perfsweep's terms."""
    res = run_perfsweep(["amp=true,false", *TINY], tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr[-2000:]
    assert res.stderr.startswith("perfsweep: amp=true,false: several values are a sweep, one job each: add -m; ")
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "results.db").exists()


def test_a_mistyped_command_is_named_with_the_one_meant(tmp_path: Path):
    res = run_perfsweep(["reprot", "--sweep", "1"], tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("perfsweep: unknown command 'reprot'; did you mean 'report'?"), res.stderr
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


@pytest.mark.parametrize("run_dir", [".", "{tmp}", "kept"])
def test_a_refused_run_never_removes_the_launch_folder_or_a_folder_that_was_there(run_dir: str, tmp_path: Path):
    """hydra.run.dir pointing at the launch folder (or at a folder of it that existed) holds the
    user's files: the refusal leaves them (it removed the launch folder and its empty parent)."""
    launch = tmp_path / "empty"
    (launch / "kept").mkdir(parents=True)
    res = run_perfsweep([*TINY, "seed=-1", f"hydra.run.dir={run_dir.format(tmp=launch)}"], launch)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "seed=-1" in res.stderr, res.stderr
    assert (launch / "kept").is_dir()


def _damaged(db: Path, how: str) -> None:
    """Damage ``db`` as the review did: a table dropped, a column dropped, pages overwritten."""
    if how == "corrupt":
        import random

        size = db.stat().st_size
        with db.open("r+b") as fh:
            fh.seek(size // 2)
            fh.write(random.Random(0).randbytes(size // 3))
        return
    con = sqlite3.connect(db)
    con.execute("DROP TABLE steps" if how == "table" else "ALTER TABLE runs DROP COLUMN tokens_per_s")
    con.commit()
    con.close()


@pytest.mark.parametrize(
    ("how", "said"),
    [("table", "table steps missing"), ("column", "column runs.tokens_per_s missing"), ("corrupt", "SQLite ")],
)
def test_a_damaged_database_is_refused_before_any_job_and_left_as_it_was(seeded_db: Path, how: str, said: str, capsys):
    """A results.db with a table or column gone, or pages overwritten: a sweep into it trained every
    job and then stored nothing, upgrade said "schema already at head", report blamed --out. Each now
    answers in one line what is wrong, exit 2, and the file is not written."""
    from perfsweep import upgrade
    from perfsweep.report.__main__ import main as report_main

    store.connect(f"sqlite:///{seeded_db}").dispose()  # checkpointed: the file alone holds everything
    _damaged(seeded_db, how)
    before = seeded_db.read_bytes()
    res = run_perfsweep(["-m", "amp=true,false", *TINY, f"db.url=sqlite:///{seeded_db}"], seeded_db.parent)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr[-2000:]
    assert res.stderr.startswith(f"perfsweep: cannot use db.url='sqlite:///{seeded_db}': ") and said in res.stderr
    assert "perfsweep cannot repair it" in res.stderr and res.stderr.rstrip().endswith("no job was started")
    assert upgrade.main(["--db", str(seeded_db)]) == 2
    assert report_main(["--db", str(seeded_db), "--out", str(seeded_db.parent / "rep")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(": ")[0:2] for line in lines] == [
        ["perfsweep upgrade", f"--db {seeded_db}"],
        ["perfsweep report", f"--db {seeded_db}"],
    ], lines
    assert all(said in line and "cannot repair it" in line for line in lines), lines
    assert seeded_db.read_bytes() == before and not (seeded_db.parent / "rep").exists()


def test_an_import_of_files_that_are_no_results_creates_no_database(tmp_path: Path, capsys):
    from perfsweep import importer

    (tmp_path / "notes.json").write_text("not a result")
    assert importer.main([str(tmp_path / "notes.json"), "--db", str(tmp_path / "new.db")]) == 2
    out, err = capsys.readouterr()
    assert "1 unreadable; nothing written" in out and "not a perfsweep result" in err
    assert not (tmp_path / "new.db").exists()


@pytest.mark.parametrize(
    "overrides",
    [
        ["report=${profile.enabled}"],  # an interpolation: resolved, and checked, with the config
        ["amp=${oc.env:USE_AMP,false}"],
        ["amp='false'"],  # quoted: OmegaConf reads it as false
        ["amp=true,${ckpt}"],
        ["compile='true','false'"],
        ["amp=TRUE,false"],
        ["steps.measure=3", "steps.measure=100"],  # two single values: the last one wins, as on any command line
        ["amp=choice(true,false)", "+hydra.job.env_set.X=1"],
        ["model.bias=1"],  # a preset's key: typed by its schema after composition
        ["db.url=postgresql://u:p,w@h/db"],
        ["~compile"],
    ],
)
def test_overrides_hydra_reads_as_typed_pass_the_check(overrides: list[str]):
    """The refusals above must not catch what Hydra runs as typed (interpolations and quoted
    true/false were refused once: ``report=${profile.enabled}`` had run)."""
    from perfsweep.preflight import override_problem

    assert override_problem(overrides) is None
