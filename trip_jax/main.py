"""Command line entry: ``python -m trip_jax.main --config=configs/minilm.py --workdir=DIR``.

``--mode=train`` (default) trains, or resumes, in the workdir and then scores the best
checkpoints on test. Config keys are overridden with ``--config.SECTION.KEY=VALUE``; a misspelt
key is an error. Multi-process runs (SLURM, Cloud TPU, explicit TRIP_* variables) are joined
first (``trip_jax.distributed``). Other modes, on a trained workdir:

- ``--mode=evaluate [--checkpoint=best_verifiability|best_accuracy|latest|STEP] [--split=test]``:
  scores a checkpoint (with a progress bar), writes ``DIR/eval/SPLIT.KIND-STEP.*``
  (``trip_jax.evaluate``);
- ``--mode=predict --input=FILE [--output=FILE] [--checkpoint=...]``: explains new story pairs
  (``trip_jax.predict``);
- ``--mode=random_baseline [--split=test]``: prints the random baseline's mean ± std over its
  seeds and writes ``DIR/eval/random_baseline.SPLIT.*`` (``trip_jax.random_baseline``).

A bad command line (unknown flag or config key, a value of the wrong type or outside its
choices, a config file that does not load) is one ``error: ...`` line naming the closest valid
spelling, with exit status 2, before any work starts (``trip_jax.cli``). A missing, unreadable or
mismatched checkpoint (one whose arrays differ from their saved checksums included), missing data
or spaCy model, or unusable input ends the run with a one-line ``error: ...`` message and exit
status 1; a workdir held by another training run, with exit status 2.
"""

from __future__ import annotations

import logging as std_logging
import sys
from collections.abc import Callable
from typing import Any

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from trip_jax import (builders, checkpoints, cli, distributed, evaluate, input_pipeline,
                      optimizers, predict, protocol, random_baseline, runtime, train,
                      workdir_lock)
from trip_jax.data import features, readers
from trip_jax.data.entities import SpacyModelError
from trip_jax.data.readers import TripDataError
from trip_jax.models import tiered

FLAGS = flags.FLAGS


def _evaluate(config, workdir: str) -> dict[str, Any]:
    """--mode=evaluate: scores --checkpoint on --split, writes DIR/eval/."""
    result = evaluate.evaluate_checkpoint(config, workdir, FLAGS.checkpoint, FLAGS.split,
                                          progress=True)
    if result["paths"]:
        stem = result["paths"]["json"].name.removesuffix(".json")
        print(f"wrote {result['paths']['markdown']} and the other {stem}.* reports")
    return result


def _predict(config, workdir: str) -> dict[str, Any]:
    """--mode=predict: explains the story pairs of --input with --checkpoint."""
    if not FLAGS.input:
        raise app.UsageError("--mode=predict needs --input=FILE (JSON Lines of story pairs)")
    return predict.run(config, workdir, FLAGS.input, FLAGS.output, FLAGS.checkpoint)


def _random_baseline(config, workdir: str) -> dict[str, Any]:
    """--mode=random_baseline: the random baseline's report of --split."""
    result = evaluate.random_baseline_report(config, workdir, FLAGS.split)
    if result["paths"]:
        print(random_baseline.summary(result["metrics"], FLAGS.split))
        print(f"wrote {result['paths']['markdown']} and the other reports")
    return result


# mode name -> function(config, workdir).
MODES: dict[str, Callable[[Any, str], Any]] = {
    "train": train.train_and_evaluate,
    "evaluate": _evaluate,
    "predict": _predict,
    "random_baseline": _random_baseline,
}
# Errors in what the user asked for: reported in one line, without a traceback.
USER_ERRORS = (checkpoints.CheckpointError, TripDataError, SpacyModelError,
               input_pipeline.UnknownSplitError, predict.PredictionError,
               workdir_lock.WorkdirLocked)


def define_flags(values: flags.FlagValues = FLAGS, sys_argv: list[str] | None = None) -> None:
    """Defines the command line's flags in ``values`` (tests pass a fresh FlagValues and the
    argv its config flag reads its overrides from; by default sys.argv)."""
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and reports.",
                        flag_values=values)
    flags.DEFINE_enum("mode", "train", list(MODES), "What to do with the config and workdir.",
                      flag_values=values)
    config_flags.DEFINE_config_file(
        "config", None, "A config file (configs/*.py[:loss_preset]).", flag_values=values,
        lock_config=True, sys_argv=sys_argv)
    flags.DEFINE_string("checkpoint", checkpoints.BEST_VERIFIABILITY,
                        "evaluate/predict: the checkpoint to use: best_verifiability, "
                        "best_accuracy, latest or a step number.", flag_values=values)
    flags.DEFINE_string("split", "test", "evaluate/random_baseline: the split to score: test, "
                        "the protocol's selection split (dev or dev_holdout) or train.",
                        flag_values=values)
    flags.DEFINE_string("input", None, "predict: JSON Lines file of story pairs.",
                        flag_values=values)
    flags.DEFINE_string("output", None, "predict: where to write the answers (default: "
                        "WORKDIR/predict/<input stem>.jsonl).", flag_values=values)
    flags.mark_flags_as_required(["config", "workdir"], flag_values=values)


# Config keys with a fixed set of values, checked when the flags are parsed.
CONFIG_CHOICES: dict[str, tuple] = {
    "data.format": ("", *readers.FORMATS),
    "data.protocol": protocol.PROTOCOLS,
    "data.layout": features.LAYOUTS,
    "model.dtype": tuple(builders.DTYPES),
    "model.tiered.story_score": tiered.STORY_SCORES,
    "model.tiered.padding_rows": tiered.PADDING_ROWS,
    "model.tiered.padding_row_attention": tiered.PADDING_ROW_ATTENTION,
    "model.tiered.cells": tiered.CELLS,
    "data.token_types": features.TOKEN_TYPES,
    "data.entity_padding": input_pipeline.ENTITY_PADDINGS,
    "train.optimizer": optimizers.OPTIMIZERS,
    "train.schedule": train.SCHEDULES,
    "train.prng_impl": runtime.PRNG_IMPLS,
}
# Every split name some protocol has (which ones a run has depends on its protocol).
SPLIT_NAMES = (*readers.SPLITS, "dev_holdout")


def check_flags(values: flags.FlagValues) -> None:
    """Checks the flags that depend on each other or have a fixed set of values."""
    which = values.checkpoint
    if which not in checkpoints.KINDS and not which.isdigit():
        raise cli.UsageError("--checkpoint: " + cli.unknown_choice(
            "checkpoint", which, [*checkpoints.KINDS, "STEP"]))
    if values.split not in SPLIT_NAMES:
        raise cli.UsageError("--split: " + cli.unknown_choice("split", values.split, SPLIT_NAMES))
    if values.mode == "predict" and not values.input:
        raise cli.UsageError("--mode=predict needs --input=FILE (JSON Lines of story pairs)")


define_flags()
parse_flags = cli.flags_parser(FLAGS, config_choices=CONFIG_CHOICES, check=check_flags)


class _QuietOrbax(std_logging.Filter):
    """Drops orbax's INFO chatter (several lines per checkpoint); keeps its warnings."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        return record.levelno >= std_logging.WARNING or "/orbax/" not in record.pathname


def main(argv) -> None:
    """Joins a multi-process run if there is one, then runs the selected mode (the flags are
    already parsed and checked by ``parse_flags``)."""
    del argv  # parse_flags refuses extra arguments
    logging.get_absl_handler().addFilter(_QuietOrbax())
    distributed.initialize_distributed()
    logging.info("JAX process %d / %d, local devices: %s", jax.process_index(),
                 jax.process_count(), jax.local_devices())
    logging.info("config:\n%s", FLAGS.config)
    try:
        runtime.configure_jax(FLAGS.config)
        MODES[FLAGS.mode](FLAGS.config, FLAGS.workdir)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(getattr(err, "exit_code", 1))  # 2 for a workdir held by another run


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
