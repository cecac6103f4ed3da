"""A bad command line is one ``error:`` line naming the closest valid spelling, exit status 2."""

import pathlib
import subprocess
import sys

import pytest
from absl import flags

from trip_jax import cli, main

REPO = pathlib.Path(__file__).resolve().parents[1]
BASE = ["trip_jax.main", "--config=configs/tiny.py", "--workdir=/nonexistent/run"]


def parse(argv: list[str]):
    """Parses ``argv`` with main's flags and checks, in a fresh FlagValues."""
    values = flags.FlagValues()
    main.define_flags(values, sys_argv=argv)
    parser = cli.flags_parser(values, config_choices=main.CONFIG_CHOICES, check=main.check_flags)
    return parser(argv), values


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
    ("--config=configs/tiny.py:omit_stry",
     "unknown loss preset, model preset or mode 'omit_stry'; did you mean 'omit_story'?"),
    ("--config=configs/tny.py", "configs/tny.py does not exist; did you mean "
                                "--config=configs/tiny.py?"),
    ("--split=tset", "did you mean 'test'?"),
    ("--checkpoint=latets", "did you mean 'latest'?"),
    ("--mode=predict", "--mode=predict needs --input=FILE"),
    ("stray", "unexpected arguments: stray"),
])
def test_bad_flag_is_one_line_with_the_closest_valid_spelling(flag, expected, capsys):
    assert expected in usage_error([*BASE, flag], capsys)


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


@pytest.mark.parametrize("flag, expected", [
    ("--config.train.learnin_rate=1", "did you mean --config.train.learning_rate?"),
    ("--config=configs/tiny.py:omit_stry", "did you mean 'omit_story'?"),
])
def test_main_exits_with_status_2_and_one_line(flag, expected, tmp_path):
    """The real entry point, in a subprocess: nothing written, no traceback."""
    command = [sys.executable, "-m", "trip_jax.main", "--config=configs/tiny.py",
               f"--workdir={tmp_path / 'run'}", flag]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (
        result.stderr)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", sorted(
    p.stem for p in (REPO / "configs").glob("*.py") if p.stem not in ("__init__", "base")))
def test_every_config_file_passes_the_checks(name):
    rest, values = parse(["trip_jax.main", f"--config=configs/{name}.py", "--workdir=/x"])
    assert rest == ["trip_jax.main"] and values.config.train.learning_rate > 0
