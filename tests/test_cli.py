"""A bad command line is one ``error:`` line naming the closest valid spelling or the allowed
values, exit status 2; the config is printed only with --show_config, which then stops (exit 0,
the workdir untouched)."""

import os
import pathlib
import re
import subprocess
import sys

import ml_collections
import pytest
from absl import flags

from trip_jax import cli, convert, main, run_summary, score
from trip_jax.config import sections
from trip_jax.datatools import __main__ as data_command

REPO = pathlib.Path(__file__).resolve().parents[1]
BASE = ["trip_jax.main", "--config=configs/tiny.py", "--workdir=/nonexistent/run"]


def parse(argv: list[str]):
    """Parses ``argv`` with main's flags and checks, in a fresh FlagValues."""
    values = flags.FlagValues()
    main.define_flags(values, sys_argv=argv)
    return main.flags_parser(values)(argv), values


def usage_error(argv: list[str], capsys) -> str:
    """The one stderr line of a refused ``argv`` (asserting exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == cli.USAGE_EXIT_CODE
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


@pytest.mark.parametrize("flag, expected", [
    ("--config.train.learnin_rate=1", "did you mean --config.train.learning_rate?"),
    ("--config.trian.seed=1", "did you mean --config.train.seed?"),
    ("--noconfig.train.shufle", "did you mean --config.train.shuffle?"),
    ("--mode=evalute", "did you mean 'evaluate'?"),
    ("--confg=configs/tiny.py", "unknown flag --confg; did you mean --config?"),
    ("--learning_rate=0.1", "did you mean --config.train.learning_rate?"),
    ("--config.train.learning_rate=abc", "train.learning_rate takes a float"),
    ("--config.train.num_epochs=1.5", "train.num_epochs takes an int, default 2"),
    ("--config.train.prng_impl=rgb", "train.prng_impl: unknown value 'rgb'; did you mean 'rbg'?"),
    ("--config.model.dtype=bfloat61", "did you mean 'bfloat16'?"),
    ("--config=configs/tiny.py:losses=omit_stry",
     "unknown losses 'omit_stry'; did you mean 'omit_story'?"),
    ("--config=configs/tiny.py:exact", "config argument 'exact' is not KEY=VALUE; did you mean "
     "fidelity=exact?"),
    ("--config=configs/tny.py", "configs/tny.py does not exist; did you mean "
                                "--config=configs/tiny.py?"),
    ("--split=tset", "did you mean 'test'?"),
    ("--checkpoint=latets", "did you mean 'latest'?"),
    ("--mode=predict", "--mode=predict needs --input=FILE"),
    ("stray", "unexpected arguments: stray"),
])
def test_bad_flag_is_one_line_with_the_closest_valid_spelling(flag, expected, capsys):
    assert expected in usage_error([*BASE, flag], capsys)


@pytest.mark.parametrize("flag, expected", [
    ("--config.train.batch_size=-3", "--config.train.batch_size: -3 (allowed: >= 1)"),
    ("--config.train.learning_rate=0", "--config.train.learning_rate: 0.0 (allowed: > 0)"),
    ("--config.decoding.state_threshold=1.5",
     "--config.decoding.state_threshold: 1.5 (allowed: in [0, 1))"),
    ("--config.train.num_epochs=0", "--config.train.num_epochs: 0 (allowed: >= 1)"),
    ("--config.train.warmup_fraction=1", "warmup_fraction: 1.0 (allowed: in [0, 1))"),
    ("--config.data.holdout_fraction=0", "holdout_fraction: 0.0 (allowed: in (0, 1))"),
    ("--config.model.tiered.head_dropout=1", "head_dropout: 1.0 (allowed: in [0, 1))"),
    ("--config.train.learning_rate=nan", "learning_rate: nan (allowed: > 0)"),
    ("--config.mesh.data=0", "--config.mesh.data: 0 (allowed: -1 (every device"),
    ("--config.train.init_from_checkpoint=bset", "(allowed: latest, selected, best_accuracy "
                                                 "or a step number)"),
    ("--config.train.init_skip=(", "--config.train.init_skip: '(' (allowed: a Python regular"),
    # Rules between keys.
    ("--config.model.tiered.detector_heads=3",
     "--config.model.tiered.detector_heads: 3 (allowed: a divisor of the detector width 32"),
    ("--config.data.seq_len=32", "seq_len: 32 (allowed: 0 with data.layout 'packed_tokens'"),
    ("--config.model.random_encoder.num_attention_heads=3",
     "a divisor of model.random_encoder.hidden_size (32)"),
    ("--config.model.tokenizer=", "--config.model.tokenizer: '' (allowed: a tokenizer"),
    ("--config.mesh.fsdp=-1", "--config.mesh.fsdp: -1 (allowed: not -1 when mesh.data is -1"),
    # Choice lists of the modules that use them.
    ("--config.train.selection=smoothd", "did you mean 'smoothed'?"),
    ("--config.decoding.method=coherant", "did you mean 'coherent'?"),
    ("--config.model.tiered.detector_activation=gelu2", "did you mean 'gelu'?"),
    ("--config.data.layout=packed", "data.layout: unknown value 'packed'; did you mean "
                                     "'packed_tokens'?"),
])
def test_value_out_of_range_is_one_line_naming_key_value_and_allowed(flag, expected, tmp_path,
                                                                      capsys):
    line = usage_error(["trip_jax.main", "--config=configs/tiny.py",
                        f"--workdir={tmp_path / 'run'}", flag], capsys)
    assert expected in line
    assert not (tmp_path / "run").exists()


def test_every_key_with_a_rule_exists_in_the_base_config():
    from configs import base

    keys = cli.config_values(base.get_config())
    assert not [k for k, key in sections.KEYS.items() if key.rule and k not in keys]
    assert not [k for k, key in sections.KEYS.items() if key.choices and k not in keys]


def mesh_config(data, fsdp, batch_size):
    return ml_collections.ConfigDict(dict(mesh=dict(data=data, fsdp=fsdp),
                                          train=dict(batch_size=batch_size)))


@pytest.mark.parametrize("data, fsdp, batch_size, devices", [
    (-1, 1, 8, 4), (2, 2, 4, 4), (1, -1, 12, 4), (-1, 1, 3, 1)])
def test_devices_that_fit(data, fsdp, batch_size, devices):
    main.check_devices(mesh_config(data, fsdp, batch_size), devices)


@pytest.mark.parametrize("data, fsdp, batch_size, devices, expected", [
    (-1, 1, 6, 4, "--config.train.batch_size: 6 (allowed: a multiple of 4, the devices the "
                  "batch is split over: mesh data=4 x fsdp=1)"),
    (-1, 2, 2, 4, "a multiple of 4"),  # the batch is split over data and fsdp
    (2, 1, 2, 4, "data=2, fsdp=1 (allowed: sizes whose product is the 4 devices"),
    (-1, 3, 3, 4, "data=-1, fsdp=3"),
])
def test_devices_that_do_not_fit(data, fsdp, batch_size, devices, expected):
    with pytest.raises(cli.UsageError, match="^bad value for --config") as error:
        main.check_devices(mesh_config(data, fsdp, batch_size), devices)
    assert expected in str(error.value)


def test_missing_required_flag(capsys):
    assert usage_error(["trip_jax.main", "--config=configs/tiny.py"], capsys) == (
        "error: --workdir is required")


def test_config_file_that_raises_names_its_line(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config():\n    return undefined_name\n")
    line = usage_error(["trip_jax.main", f"--config={broken}", "--workdir=/x"], capsys)
    assert "NameError" in line and "undefined_name" in line and "(line 2)" in line


def test_good_flags_parse_and_override_the_config():
    rest, values = parse([*BASE, "--config.train.learning_rate=0.5", "--mode=evaluate",
                          "--checkpoint=12", "--split=dev_holdout"])
    assert rest == ["trip_jax.main"]
    assert values.config.train.learning_rate == 0.5 and values.mode == "evaluate"
    assert values.checkpoint == "12" and values.split == "dev_holdout"


def test_a_bug_outside_the_command_line_keeps_its_traceback():
    def broken_check(values):
        raise KeyError("a bug")

    values = flags.FlagValues()
    argv = list(BASE)
    main.define_flags(values, sys_argv=argv)
    with pytest.raises(KeyError, match="a bug"):
        cli.flags_parser(values, check=broken_check)(argv)


# Every entry point: its parser and a command line it accepts.
ENTRY_POINTS = {
    "main": (lambda argv: parse(argv)[0], BASE),
    "score": (score.parse_flags, ["trip_jax.score", "--predictions=README.md", "--out=/x/out"]),
    "data": (data_command.parse_flags, ["trip_jax.datatools", "download", "--dest=/x/data"]),
    "run_summary": (run_summary.parse_flags, ["trip_jax.run_summary", str(REPO)]),
    "convert": (convert.parse_flags, ["trip_jax.convert", "--authors_model=README.md",
                                      "--workdir=/x/w"]),
}
# (entry point, mistake, what follows its command line, the line it gives); missing data (a
# --data_dir without the TRIP files) is exit status 1 in every command, as in main.
MISTAKES = [
    ("main", "bad value", ["--mode=evalute"],
     "error: --mode: unknown value 'evalute'; did you mean 'evaluate'?"),
    ("main", "unknown flag", ["--workdr=x"],
     "error: unknown flag --workdr; did you mean --workdir?"),
    ("main", "missing file", ["--config=configs/tny.py"],
     "error: config file configs/tny.py does not exist"),
    ("score", "bad value", ["--format=csv"], "error: --format: unknown value 'csv' (choices: "),
    ("score", "unknown flag", ["--fromat=auto"], "error: unknown flag --fromat; did you mean "
                                                 "--format?"),
    ("score", "missing file", ["--predictions=/x/p.jsonl"],
     "error: --predictions: /x/p.jsonl does not exist"),
    ("data", "bad value", ["--timeout=soon"],
     "error: bad value for --timeout: 'soon' (could not convert"),
    ("data", "unknown flag", ["--dset=/x"], "error: unknown flag --dset; did you mean --dest?"),
    ("run_summary", "bad value", ["--out"], "error: Missing value for flag --out"),
    ("run_summary", "unknown flag", ["--ot=/x"], "error: unknown flag --ot; did you mean --out?"),
    ("run_summary", "missing file", ["/x/seed22"], "error: RUN_DIR: /x/seed22 does not exist"),
    ("convert", "bad value", ["--encoder"], "error: Missing value for flag --encoder"),
    ("convert", "unknown flag", ["--encodr=roberta-large"],
     "error: unknown flag --encodr; did you mean --encoder?"),
    ("convert", "missing file", ["--authors_model=/x/m.pth"],
     "error: --authors_model: /x/m.pth does not exist"),
]


@pytest.mark.parametrize("entry, mistake, added, expected", MISTAKES,
                         ids=[f"{entry}-{mistake}" for entry, mistake, *_ in MISTAKES])
def test_every_entry_point_refuses_a_mistake_in_one_line_with_status_2(entry, mistake, added,
                                                                       expected, capsys):
    parser, good = ENTRY_POINTS[entry]
    parser(good)  # accepted
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        parser([*good, *added])
    assert exit_info.value.code == cli.USAGE_EXIT_CODE
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), captured.err
    assert "Traceback" not in captured.err and captured.out == ""


@pytest.mark.parametrize("argv, expected", [
    (["trip_jax.datatools"], "error: missing command: one of stats, download, tfds_build, "
                        "entities_eval (see --help)"),
    (["trip_jax.datatools", "stast"], "error: unknown command 'stast'; did you mean 'stats'?"),
    (["trip_jax.datatools", "stats", "stray"], "error: unexpected arguments: stray"),
    (["trip_jax.run_summary", "--out=/x"], "error: missing RUN_DIR (one or more)"),
    (["trip_jax.score", "--out=/x"], "error: --predictions is required"),
])
def test_commands_and_arguments_are_checked_as_flags_are(argv, expected, capsys):
    parser = {"trip_jax.datatools": data_command.parse_flags, "trip_jax.score": score.parse_flags,
              "trip_jax.run_summary": run_summary.parse_flags}[argv[0]]
    with pytest.raises(SystemExit) as exit_info:
        parser(argv)
    assert exit_info.value.code == cli.USAGE_EXIT_CODE
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), lines


@pytest.mark.parametrize("argv", [["trip_jax.score", "--help"], ["trip_jax.datatools", "stats", "-h"],
                                  ["trip_jax.convert", "--helpfull"]])
def test_help_shows_the_commands_text_and_flags_and_exits_0(argv, capsys):
    parser = {"trip_jax.datatools": data_command.parse_flags, "trip_jax.score": score.parse_flags,
              "trip_jax.convert": convert.parse_flags}[argv[0]]
    with pytest.raises(SystemExit) as exit_info:
        parser(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert f"python -m {argv[0]}" in out and "flags:" in out
    assert ("--authors_model" if argv[0] == "trip_jax.convert" else "--data_dir") in out


@pytest.mark.parametrize("flag, devices, expected", [
    ("--config.train.learnin_rate=1", 1, "did you mean --config.train.learning_rate?"),
    ("--config=configs/tiny.py:losses=omit_stry", 1, "did you mean 'omit_story'?"),
    # Checked once the devices are known, before any data is read.
    ("--config.mesh.data=2", 1, "data=2, fsdp=1 (allowed: sizes whose product is the 1 device;"),
    ("--config.train.batch_size=3", 2, "--config.train.batch_size: 3 (allowed: a multiple of 2"),
])
def test_main_exits_with_status_2_and_one_line(flag, devices, expected, tmp_path, run_main):
    """The real entry point, in a subprocess: nothing written, no traceback, no config."""
    result = run_main(f"--workdir={tmp_path / 'run'}", flag,
                      env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (
        result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "run").exists()


CONFIG_LINES = ("learning_rate: 0.001", "data_dir: ")  # of the printed config


def test_predict_shows_its_error_without_info_lines_or_config(tmp_path, run_main):
    """--mode=predict logs warnings and errors only; no config above the error."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"stories": [["A.", "B."], ["A.", "C."]]}\n')
    result = run_main(f"--workdir={tmp_path / 'run'}", "--mode=predict", f"--input={pairs}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: no checkpoint")
    assert not re.search(r"^I\d{4} ", result.stderr, flags=re.MULTILINE), result.stderr
    assert not any(line in result.stdout + result.stderr for line in CONFIG_LINES)


def test_show_config_prints_the_config_and_stops(tmp_path, run_main):
    workdir = tmp_path / "run"
    result = run_main(f"--workdir={workdir}", "--show_config")  # --mode=train by default
    assert result.returncode == 0, result.stderr[-2000:]
    assert all(line in result.stdout and line not in result.stderr for line in CONFIG_LINES)
    assert not workdir.exists()  # nothing trained, nothing written
    assert list(tmp_path.iterdir()) == []


OWN_CONFIG = """from configs import base


def get_config(argument=None):
    config = base.get_config(argument, default_fidelity="clean")
    config.data.max_pairs = 8
    config.train.seed = 1234
    return config
"""


def test_a_config_file_loads_from_any_folder(tmp_path, main_job_env):
    """From a folder that is not the repository, with ``trip_jax`` importable and ``configs``
    not (as an editable install has them): the repository's config by absolute and by relative
    path, and a user's own file beside no ``configs`` package that imports ``configs``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "trip_jax").symlink_to(REPO / "trip_jax")  # this checkout's trip_jax, not configs/
    folder = tmp_path / "elsewhere"
    (folder / "mine").mkdir(parents=True)
    (folder / "mine" / "own.py").write_text(OWN_CONFIG)
    env = main_job_env(PYTHONPATH=str(site))
    tiny = REPO / "configs" / "tiny.py"
    for argument, seed in [(str(tiny), 22), (os.path.relpath(tiny, folder) + ":fidelity=exact", 22),
                           ("mine/own.py", 1234)]:
        result = subprocess.run(
            [sys.executable, "-m", "trip_jax.main", f"--config={argument}", "--workdir=run",
             "--show_config"], cwd=folder, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (argument, result.stderr[-2000:])
        assert "max_pairs: 8" in result.stdout  # configs/tiny.py's, and the own file's
        assert re.search(rf"^  seed: {seed}$", result.stdout, flags=re.MULTILINE), argument
    assert sorted(p.name for p in folder.iterdir()) == ["mine"]  # no workdir


@pytest.mark.parametrize("name", sorted(
    p.stem for p in (REPO / "configs").glob("*.py") if p.stem not in ("__init__", "base")))
def test_every_config_file_passes_the_checks(name):
    rest, values = parse(["trip_jax.main", f"--config=configs/{name}.py", "--workdir=/x"])
    assert rest == ["trip_jax.main"] and values.config.train.learning_rate > 0


def test_main_help_exits_0_as_the_other_commands(run_main):
    result = run_main("--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--workdir" in result.stdout and "Try --helpfull" in result.stdout
