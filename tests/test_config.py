from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.errors import ConfigCompositionException

from perfsweep.__main__ import register
from perfsweep.config import (
    AmpDtype,
    ConfigError,
    PerfsweepConfig,
    to_plain_dict,
    to_run_config,
)
from perfsweep.preflight import data_keys_read
from tests.util import REPO, TINY, run_perfsweep

register()  # the schema, and the sweeper config.yaml names


def compose_cfg(overrides: list[str]):
    with initialize_config_module(version_base="1.3", config_module="perfsweep.conf"):
        return compose(config_name="config", overrides=overrides)


def test_defaults_compose_and_validate():
    cfg = to_run_config(compose_cfg([]))
    assert (cfg.amp, cfg.ckpt, cfg.compile) == (False, False, False)
    assert cfg.model.name == "small" and cfg.data.name == "stdlib"
    assert cfg.db.url is None  # resolved to <launch dir>/results.db at run time
    assert (cfg.batch, cfg.seq_len) == (8, 128)  # the documented defaults


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("data.vocab_limit=abc", "data.vocab_limit='abc': must be an integer or null"),
        ("data.vocab_limit=100.5", "data.vocab_limit=100.5: must be an integer or null"),  # was OmegaConf's, keyless
        ("data.synthetic_tokens=true", "data.synthetic_tokens=True: must be an integer"),
        ("model.dropout=true", "model.dropout=True: must be a number"),
        # Hydra reads 2024.10 as 2024.1: another folder, so a decimal is refused, not turned into text
        ("data.path=2024.10", "data.path=2024.1: must be a string; quote it as typed: data.path='...'"),
    ],
)
def test_the_untyped_nodes_values_are_typed_by_the_key(override: str, said: str):
    extra = ["data=synthetic"] if "synthetic" in override else ["data=textfile"] if "path" in override else []
    with pytest.raises(ConfigError) as err:
        to_run_config(compose_cfg([*extra, override]))
    assert str(err.value) == f"invalid config: {said}"


def test_a_number_given_for_a_string_is_that_string():
    """Hydra parses ``data.path=2024`` as an int; the folder is called 2024."""
    cfg = to_run_config(compose_cfg(["data=textfile", "data.path=2024", "data.encoding=cl100k_base"]))
    assert cfg.data.path == "2024" and to_plain_dict(cfg)["data"]["path"] == "2024"


@pytest.mark.parametrize("preset", ["stdlib", "textfile", "synthetic"])
def test_every_data_preset_takes_the_keys_its_kind_reads_and_refuses_another_kind_s(preset: str):
    """``data.cache_dir=...`` was refused on every preset ('did you mean data.cache_dir?'): no
    preset set it, so only ``+data.cache_dir`` worked. A key another kind reads, added with ``+``,
    was taken and ignored (``+data.path`` on the stdlib trained on the stdlib)."""
    path = ["data.path=/corpus"] if preset == "textfile" else []
    cfg = to_run_config(compose_cfg([f"data={preset}", "data.cache_dir=/tokens", *path]))
    assert cfg.data.cache_dir == "/tokens"
    assert data_keys_read([([f"data={preset}", "data.cache_dir=/tokens", *path], cfg)]) == []
    other = {"textfile": "+data.synthetic_vocab=99", "stdlib": "+data.glob=*.md", "synthetic": "data.vocab_limit=99"}
    point = [f"data={preset}", *path, other[preset]]
    with pytest.raises(
        ConfigError, match=rf"only data.kind=\w+( or \w+)? reads? it, and the data in use is data.kind={preset}"
    ):
        data_keys_read([(point, to_run_config(compose_cfg(point)))])


def test_a_data_key_some_grid_points_read_is_a_note_for_the_others():
    """data=synthetic,textfile ++data.path=x is a grid over data kinds: refused by grid point
    when each was checked alone; now the synthetic points run without the path, and say so."""
    points = [["data=synthetic", "++data.path=/corpus"], ["data=textfile", "++data.path=/corpus"]]
    notes = data_keys_read([(p, to_run_config(compose_cfg(p))) for p in points])
    assert notes == [
        "perfsweep: data.path='/corpus': only data.kind=textfile reads it; "
        "the grid points with data.kind=synthetic run without it"
    ]
    removing = ["data=synthetic", "~data.path"]  # a removal sets nothing
    assert data_keys_read([(removing, to_run_config(compose_cfg(removing[:1])))]) == []
    custom = [
        "model=custom",
        "model._target_=my_pkg.model",
        "data=custom",
        "data._target_=my_pkg.data",
        "+data.path=/x",
    ]
    # a data factory takes +data.path as its own argument
    assert data_keys_read([(custom, to_run_config(compose_cfg(custom)))]) == []


def test_a_grid_over_data_kinds_passes_the_key_check_in_the_sweeper(tmp_path: Path):
    """The sweeper checks the grid as a whole: the refusal that stops this sweep before any job
    is the textfile point's short text, not the key the synthetic point does not read."""
    (tmp_path / "short.txt").write_text("a few words")
    res = run_perfsweep(
        ["-m", "data=synthetic,textfile", f"++data.path={tmp_path / 'short.txt'}", "device=cpu"], tmp_path
    )
    assert res.returncode == 2 and "fewer than one batch" in res.stderr and "reads it" not in res.stderr, res.stderr


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["batch=0"], "batch=0"),
        (["batch=abc"], "batch='abc'"),  # batch is typed in __post_init__: an integer, or max
        (["batch=2.5"], "batch=2.5"),
        (["seq_len=-1"], "seq_len=-1"),
        (["seq_len=4096"], "seq_len=4096"),  # beyond model.max_seq_len
        (["workers=-2"], "workers=-2"),
        (["model.n_heads=3"], "model.d_model=256"),
        (["model.dropout=1.5"], "model.dropout=1.5"),
        (["steps.measure=0"], "steps.measure=0"),
        (["steps.measure=1"], "steps.measure=1"),  # no spread: a 0-wide interval and a verdict were shown
        (["profile.active=0"], "profile.active=0"),
        (["amp=true", "amp_dtype=fp16", "device=cpu"], "amp_dtype='fp16'"),
        (["data=textfile"], "data.path=None"),
        (["timeout_s=0"], "timeout_s=0"),
        (["lr=inf"], "lr=inf"),  # was taken, and PostgreSQL then refused the run's config JSON
        (["lr=nan"], "lr=nan"),
        (["weight_decay=-0.1"], "weight_decay=-0.1"),  # AdamW's own error came only inside the job
        (["grad_scaler_init_scale=inf"], "grad_scaler_init_scale=inf"),
    ],
)
def test_range_errors_name_key_value_and_rule(overrides, key):
    with pytest.raises(ConfigError) as err:
        to_run_config(compose_cfg(overrides))
    msg = str(err.value)
    assert key in msg and "\n" not in msg
    assert "must" in msg  # says what is allowed


@pytest.mark.parametrize("override", ["amp=maybe", "amp_dtype=fp8", "device=tpu", "nosuchkey=1"])
def test_wrong_type_or_unknown_key_fails_at_composition(override):
    with pytest.raises(ConfigCompositionException):
        compose_cfg([override])


def test_every_preset_composes():
    for model in ("small", "tiny", "minigpt_seed", "gpt2_small"):
        cfg = to_run_config(compose_cfg([f"model={model}"]))
        assert cfg.model.name == model
    seed = to_run_config(compose_cfg(["model=minigpt_seed"])).model.gpt
    assert (seed.n_layers, seed.n_heads, seed.d_model, seed.d_ff) == (12, 4, 768, 3072)
    for data in ("stdlib", "synthetic"):
        assert to_run_config(compose_cfg([f"data={data}"])).data.name == data


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "experiments").glob("*.yaml")))
def test_experiments_compose(name):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "experiments")):
        cfg = compose(config_name=name, return_hydra_config=True)
    assert cfg.hydra.sweeper.params, f"{name}.yaml defines no grid"
    run_cfg = to_run_config({k: v for k, v in cfg.items() if k != "hydra"})
    assert run_cfg.name == name


def _every_config() -> list[tuple[str, PerfsweepConfig]]:
    """Every preset, experiment and example composed, with a few overrides that reach the other
    value kinds (a factory's nested arguments, null, enums, tuples)."""
    out = [(f"model={m}", to_run_config(compose_cfg([f"model={m}"]))) for m in ("tiny", "small", "gpt2_small")]
    out.append(("model.name=123", to_run_config(compose_cfg(["model.name=123"]))))  # a string, as OmegaConf typed it
    out.append(("minigpt_seed", to_run_config(compose_cfg(["model=minigpt_seed", "data=synthetic", "amp=true"]))))
    for folder in ("experiments", "examples"):
        for path in sorted((REPO / folder).glob("*.yaml")):
            with initialize_config_dir(version_base="1.3", config_dir=str(REPO / folder)):
                nested = ["+model.nested={a: [1, 2.5, null], b: {c: x}}"] if folder == "examples" else []  # a factory's
                cfg = compose(config_name=path.stem, overrides=nested)
            out.append((f"{folder}/{path.name}", to_run_config(cfg)))
    return out


def test_the_plain_config_is_what_omegaconf_would_make_of_it():
    """to_plain_dict reads the dataclasses without OmegaConf (9 ms a call there): the same dict,
    types and key order included, or every stored config hash would change."""
    import json

    from omegaconf import OmegaConf

    from perfsweep import config

    configs = _every_config()
    assert any(c.model.args.get("nested") == {"a": [1, 2.5, None], "b": {"c": "x"}} for _, c in configs)
    for name, cfg in configs:
        reference = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
        assert json.dumps(config._plain(cfg)) == json.dumps(reference), name  # types and order too
        assert config._plain(cfg) == reference, name


def test_minigpt_seed_experiment_matches_source_script():
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "experiments")):
        cfg = compose(config_name="minigpt_seed")
    run_cfg = to_run_config(cfg)
    assert (run_cfg.batch, run_cfg.seq_len, run_cfg.data.vocab_limit) == (2, 1024, 10000)
    assert run_cfg.amp_dtype == AmpDtype.fp16  # the source's kernels are *_fp16_s1688gemm_*


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("compile_cache=warm", "compile_cache"),
        ("model.vocab_multiple=0", "model.vocab_multiple=0: must be a positive integer"),
        # the contract's own keys are typed too: a number of class names ran to a TypeError in the job
        ("model.ckpt_modules=[1,2]", r"model.ckpt_modules=\[1, 2\]: must be a list of class names"),
        ("model.name=1.5", "model.name=1.5: must be a string; quote it as typed"),
    ],
)
def test_new_settings_are_checked(override, message):
    with pytest.raises(Exception, match=message):  # Hydra's own enum error, or our ConfigError
        to_run_config(compose_cfg([override]))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+foo=1", "invalid config: +foo=1: no such key; python -m perfsweep --help lists them"),
        ("+steps.mesure=5", "invalid config: +steps.mesure=5: no such key; did you mean steps.measure? "),
        ("+profile.activ=2", "invalid config: +profile.activ=2: no such key; did you mean profile.active? "),
        # a new node: the key and value as typed (it said +stepz={'measure': 5}), and the closest key to the whole
        ("+stepz.measure=5", "invalid config: +stepz.measure=5: no such key; did you mean steps.measure? "),
        ("+foo.bar=null", "invalid config: +foo.bar=null: no such key; python -m perfsweep --help lists them"),
        ("+foo=true", "invalid config: +foo=true: no such key; python -m perfsweep --help lists them"),
    ],
)
def test_a_key_added_with_plus_that_the_schema_does_not_declare_is_refused(override, message):
    """Hydra accepts ``+key=value`` into the structured config and the dataclasses dropped it: a
    sweep with ``+steps.mesure=5`` ran the default 10 measured steps without a word."""
    cfg = compose_cfg([override])
    with pytest.raises(ConfigError) as raised:
        to_run_config(cfg)
    assert str(raised.value).startswith(message), raised.value
    # a factory's own keys are its business (model.width of a custom model): checked by the factory's node
    custom = to_run_config(compose_cfg(["model=custom", "model._target_=my_pkg.models.build", "+model.width=8"]))
    assert custom.model.args == {"width": 8}
    with pytest.raises(ConfigError) as raised:  # sweep.* is the sweeper's: never offered as the key meant
        to_run_config(compose_cfg(["+sweep.idd=3"]))
    assert "did you mean sweep." not in str(raised.value), raised.value


def test_plain_dict_is_json_ready():
    import json

    d = to_plain_dict(PerfsweepConfig(amp=True, amp_dtype=AmpDtype.bf16, batch=3))
    assert json.loads(json.dumps(d)) == d  # plain JSON types only: enums became strings
    assert (d["amp"], d["amp_dtype"], d["batch"], d["device"]) == (True, "bf16", 3, "auto")
    assert d["model"]["n_layers"] == PerfsweepConfig().model.gpt.n_layers and d["sweep"]["n_jobs"] == 1
    assert to_run_config(d) == PerfsweepConfig(amp=True, amp_dtype=AmpDtype.bf16, batch=3)  # round trip


def test_bad_grid_point_stops_sweep_before_any_job(tmp_path: Path):
    res = run_perfsweep(["-m", "batch=4,0", *[o for o in TINY if not o.startswith("batch")]], tmp_path)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("perfsweep:")]
    assert len(lines) == 1
    assert "batch=0" in lines[0] and "must be a positive integer" in lines[0] and "2/2" in lines[0]
    assert not (tmp_path / "results.db").exists()
    assert not (tmp_path / "multirun").exists()


def test_a_mistyped_or_misplaced_experiment_name_gets_one_line_naming_the_fix(tmp_path: Path):
    """``-cn amp_ckp`` answered with Hydra's config search path; ``-cn amp_ckpt`` without ``-cd
    experiments`` too. Each is now one line: the closest name and every choice, or the -cd to add.
    A folder with a space in its name is read whole (it was cut at the space: no choice, no hint)."""
    for folder in ("experiments", "my experiments"):
        shutil.copytree(Path(__file__).parents[1] / "experiments", tmp_path / folder)
        res = run_perfsweep(["-cd", folder, "-cn", "amp_ckp"], tmp_path)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert lines[0].startswith(f"perfsweep: -cn amp_ckp: no config amp_ckp.yaml in {tmp_path / folder} or ")
        assert "did you mean -cn amp_ckpt? choices: amp_ckpt, batch_seq, compile, config, " in lines[0], lines[0]
    shutil.rmtree(tmp_path / "my experiments")
    res = run_perfsweep(["-cn", "amp_ckpt"], tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == (
        "perfsweep: -cn amp_ckpt: not found in perfsweep's own configs; it is in ./experiments: add -cd experiments; "
        "no job was started"
    ), res.stderr
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "cnn.yaml").write_text("defaults:\n  - config\n  - _self_\n")
    res = run_perfsweep(["-cd", "examples", "-cn", "amp_ckpt"], tmp_path)  # the wrong folder: replace it
    assert res.returncode == 2 and res.stderr.strip().endswith(
        "it is in ./experiments: use -cd experiments; no job was started"
    ), res.stderr
    res = run_perfsweep(["-cn", "amp_ckp"], tmp_path)  # a typo, and no -cd
    assert res.returncode == 2 and "; did you mean -cd experiments -cn amp_ckpt? choices: config;" in res.stderr
    assert not (tmp_path / "results.db").exists() and not (tmp_path / "outputs").exists()


def test_an_experiment_run_without_m_says_its_grid_was_left_out(tmp_path: Path):
    """``-cn amp_ckpt`` without ``-m`` ran one job (amp and ckpt off) and said nothing of the 2x2
    grid in its hydra.sweeper.params; it still runs the one job (a plain run is how one point is
    tried), and says first which values it runs instead. Keys given on the command line are that
    point's and a key with one value is no grid: neither is named; a key deleted (~) is not given."""
    from omegaconf import OmegaConf

    from perfsweep.__main__ import _grid_left_out

    experiments = Path(__file__).parents[1] / "experiments"
    res = run_perfsweep(["-cd", str(experiments), "-cn", "amp_ckpt", "device=cpu", *TINY], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr.splitlines()[0] == (
        "perfsweep: this config defines a grid in hydra.sweeper.params (amp=true,false ckpt=true,false), which "
        "only -m runs; running one job with amp=false ckpt=false"
    ), res.stderr
    assert "(1 run, 1 ok)" in res.stdout
    cfg = OmegaConf.create({"amp": True, "ckpt": False, "model": {"name": "Tiny"}})

    def left(task: list[str], params: dict) -> tuple[str, str]:
        return _grid_left_out(OmegaConf.create({"overrides": {"task": task}, "sweeper": {"params": params}}), cfg)

    assert left(["+amp=true", "batch=4"], {"amp": "true,false"}) == ("", "")  # every key of the grid given
    assert left(["amp=true"], {"amp": "true,false", "ckpt": "true,false"}) == ("ckpt=true,false", "ckpt=false")
    assert left([], {"amp": "false", "model.name": "choice(Tiny,small)"}) == (
        "model.name=choice(Tiny,small)",
        "model.name=Tiny",
    )
    assert left(["~ckpt"], {"ckpt": "true,false"}) == ("ckpt=true,false", "ckpt=false")
    assert _grid_left_out(OmegaConf.create({"overrides": {"task": []}, "sweeper": {}}), cfg) == ("", "")  # no grid


def test_a_missing_defaults_entry_is_not_blamed_on_cn(tmp_path: Path):
    """``-cn mine`` is found, but its defaults list names a config that is not on the search path:
    Hydra raises the same MissingConfigException as for a missing ``-cn``, and the one line said
    "-cn base_settings: no config base_settings.yaml", a -cn the user never gave."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "mine.yaml").write_text(
        "defaults:\n  - config\n  - base_settings\n  - _self_\nhydra:\n  searchpath: [pkg://perfsweep.conf]\n"
    )
    res = run_perfsweep(["-cd", "mine", "-cn", "mine"], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "-cn base_settings" not in lines[0], lines[0]
    assert lines[0].startswith(
        f"perfsweep: mine: its defaults list names base_settings: no config base_settings.yaml in {tmp_path / 'mine'}"
    ), lines[0]


def test_help_and_cfg_job(tmp_path: Path):
    res = run_perfsweep(["--help"], tmp_path)
    assert res.returncode == 0 and "amp" in res.stdout and "model: " in res.stdout
    res = run_perfsweep(["--cfg", "job", "amp=true"], tmp_path)
    assert res.returncode == 0 and "amp: true" in res.stdout


def test_a_launcher_whose_plugin_is_missing_names_the_extra_to_install():
    """Hydra's answers when hydra-joblib-launcher or hydra-submitit-launcher is not installed (as a
    new user's venv without the extras gave them): the preset is missing, or perfsweep_slurm cannot
    load the submitit preset it builds on. Each becomes one line naming the pip extra."""
    from hydra.errors import MissingConfigException

    from perfsweep.preflight import error_line

    joblib = MissingConfigException(
        "Could not find 'hydra/launcher/joblib'", missing_cfg_file="hydra/launcher/joblib", options=["basic"]
    )
    assert error_line(joblib) == (
        "hydra/launcher=joblib: no such preset; its plugin is not installed: pip install 'perfsweep[joblib]'"
    )
    slurm = ConfigCompositionException(
        "In 'hydra/launcher/perfsweep_slurm': Could not load 'hydra/launcher/submitit_slurm'."
    )
    assert error_line(slurm) == (
        "hydra/launcher=perfsweep_slurm: needs hydra/launcher/submitit_slurm; "
        "its plugin is not installed: pip install 'perfsweep[slurm]'"
    )
    typo = MissingConfigException("", missing_cfg_file="hydra/launcher/joblb", options=["basic", "joblib"])
    assert error_line(typo).startswith("hydra/launcher=joblb: no such preset; did you mean hydra/launcher=joblib?")


def test_job_folder_names_leave_out_what_perfsweep_sets_itself():
    """A job folder is named from its overrides (Hydra's override_dirname) less exclude_keys: the
    sweep.* and launcher.* keys the sweeper sets or that do not change what a job measures. One
    left out of the list (sweep.searches) put ``sweep.searches=0`` in every folder name, and a
    resume, where it differs, reran a grid point into a new folder."""
    from dataclasses import fields

    from hydra import compose, initialize_config_module

    from perfsweep.config import LauncherConfig, SweepContext

    with initialize_config_module(version_base="1.3", config_module="perfsweep.conf"):
        hc = compose(config_name="config", return_hydra_config=True).hydra
    excluded = set(hc.job.config.override_dirname.exclude_keys)
    ours = {f"sweep.{f.name}" for f in fields(SweepContext)} | {f"launcher.{f.name}" for f in fields(LauncherConfig)}
    assert ours - excluded == set()
