"""Command line entry: ``python -m trip_jax.main --config=configs/minilm.py --workdir=DIR``.

``--mode``: train (default), cross_validate, evaluate, predict, random_baseline or compile; keys
are set with ``--config.SECTION.KEY=VALUE``. A bad command line is one ``error:`` line, exit 2;
a failed run, exit 1. Details: README.md, docs/reference.md#allowed-values, docs/compile.md.
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import sys
from collections.abc import Callable
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

# Only what checks the flags and the config: each mode imports JAX, the model and the pipeline
# when it runs (a mistake answers in a second; tests/test_imports.py).
from trip_jax import cli
from trip_jax.runtime import terminal
from trip_jax.training import checkpoint_names as checkpoints
from trip_jax.config import sections
from trip_jax.config.messages import ConfigError, unknown_choice
from trip_jax.config.typed import typed
from trip_jax.data import readers

FLAGS = flags.FLAGS


def _train(config, workdir: str) -> Any:
    """--mode=train: ``trip_jax.train.train_and_evaluate``."""
    from trip_jax import train
    return train.train_and_evaluate(config, workdir)


def _cross_validate(config, workdir: str) -> Any:
    """--mode=cross_validate: ``trip_jax.cross_validate.cross_validate``."""
    from trip_jax import cross_validate
    return cross_validate.cross_validate(config, workdir)


def _evaluate(config, workdir: str) -> dict[str, Any]:
    """--mode=evaluate: scores --checkpoint (of every --members workdir: their ensemble) on
    --split, writes DIR/eval/."""
    from trip_jax.evaluation import ensemble
    result = ensemble.evaluate_members(config, workdir, FLAGS.checkpoint, FLAGS.split,
                                       members=FLAGS.members or (), progress=True)
    if result["paths"]:
        stem = result["paths"]["json"].name.removesuffix(".json")
        print(f"wrote {result['paths']['markdown']} and the other {stem}.* reports")
    return result


def _predict(config, workdir: str) -> dict[str, Any]:
    """--mode=predict: explains the story pairs of --input with --checkpoint."""
    if not FLAGS.input:
        raise app.UsageError("--mode=predict needs --input=FILE (JSON Lines of story pairs)")
    from trip_jax.evaluation import predict
    return predict.run(config, workdir, FLAGS.input, FLAGS.output, FLAGS.checkpoint,
                       members=FLAGS.members or ())


def _random_baseline(config, workdir: str) -> dict[str, Any]:
    """--mode=random_baseline: the random baseline's report of --split."""
    from trip_jax.evaluation import evaluate, random_baseline
    result = evaluate.random_baseline_report(config, workdir, FLAGS.split)
    if result["paths"]:
        print(random_baseline.summary(result["metrics"], FLAGS.split))
        print(f"wrote {result['paths']['markdown']} and the other reports")
    return result


def _compile(config, workdir: str) -> Any:
    """--mode=compile: the train and eval steps compiled for every chip of --topology
    (``trip_jax.compile.run``)."""
    from trip_jax.compile import run
    return run.run(config, workdir, FLAGS.topology)


# mode name -> function(config, workdir).
MODES: dict[str, Callable[[Any, str], Any]] = {
    "train": _train,
    "cross_validate": _cross_validate,
    "evaluate": _evaluate,
    "predict": _predict,
    "random_baseline": _random_baseline,
    "compile": _compile,
}
# The modes that train (and check the config against the devices first).
TRAINING_MODES = ("train", "cross_validate")
# The modes that read the data directory of the config (evaluate reads its checkpoint's first).
DATA_MODES = ("train", "cross_validate", "random_baseline")
# The modes that read --members (an ensemble of trained workdirs), and a checkpoint of each
# (else of --workdir).
ENSEMBLE_MODES = ("evaluate", "predict")


def user_errors() -> tuple[type[Exception], ...]:
    """Errors in what the user asked for: reported in one line, without a traceback (imported
    when a mode runs)."""
    from trip_jax.data import input_pipeline
    from trip_jax.data.entities import SpacyModelError
    from trip_jax.evaluation import ensemble, predict
    from trip_jax.runtime import hub, workdir_lock
    from trip_jax.training.checkpoint_reads import CheckpointError
    from trip_jax.compile.run import CompileError
    return (CheckpointError, CompileError, readers.TripDataError, SpacyModelError,
            input_pipeline.UnknownSplitError, predict.PredictionError,
            workdir_lock.WorkdirLocked, hub.HubUnavailableError, ensemble.EnsembleError)


def define_flags(values: flags.FlagValues = FLAGS, sys_argv: list[str] | None = None) -> None:
    """Defines the command line's flags in ``values`` (tests pass a fresh FlagValues and the
    argv its config flag reads its overrides from; by default sys.argv)."""
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and reports.",
                        flag_values=values)
    flags.DEFINE_enum("mode", "train", list(MODES), "What to do with the config and workdir.",
                      flag_values=values)
    config_flags.DEFINE_config_file(
        "config", None, "A config file (configs/*.py[:fidelity=F,recipe=R,losses=L]).",
        flag_values=values, lock_config=True, sys_argv=sys_argv)
    flags.DEFINE_string("checkpoint", checkpoints.SELECTED,
                        "evaluate/predict: the checkpoint to use: selected, best_accuracy, "
                        "latest or a step number.",
                        flag_values=values)
    flags.DEFINE_string("split", "test", "evaluate/random_baseline: the split to score: test, "
                        "the protocol's selection split (dev or dev_holdout) or train.",
                        flag_values=values)
    flags.DEFINE_string("input", None, "predict: JSON Lines file of story pairs.",
                        flag_values=values)
    flags.DEFINE_string("output", None, "predict: where to write the answers (default: "
                        "WORKDIR/predict/<input stem>.jsonl).", flag_values=values)
    flags.DEFINE_list("members", None, "evaluate/predict: trained workdirs DIR,DIR,... whose "
                      "averaged beliefs answer as one model (an ensemble; --checkpoint of each); "
                      "--workdir takes the reports.", flag_values=values)
    flags.DEFINE_string("name", None, "The model's name in the reports and pages this command "
                        "writes (default: ENCODER (RECIPE, seed SEED), read off the config).",
                        flag_values=values)
    flags.DEFINE_string("topology", None, "compile: the Cloud TPU accelerator type to compile "
                        "for (v5e-8 or v5litepod-8, v5p-8, v6e-8, v5e-256, ...), a "
                        "topology (v5e:2x2), or NVIDIA GPUs (h100, h200, a100; a node of 8: "
                        "h100x8; two nodes: 2xh100x8).", flag_values=values)
    flags.DEFINE_bool("show_config", False, "Print the resolved config and exit: no mode runs and "
                      "the workdir is not touched (training saves the config as "
                      "WORKDIR/config.json).", flag_values=values)
    flags.mark_flags_as_required(["config", "workdir"], flag_values=values)


# Every split name some protocol has (which ones a run has depends on its protocol).
SPLIT_NAMES = (*readers.SPLITS, "dev_holdout", "dev_fold")


def check_flags(values: flags.FlagValues) -> None:
    """Checks the flags that depend on each other or have a fixed set of values."""
    which = values.checkpoint
    if which not in checkpoints.KINDS and not which.isdigit():
        raise cli.UsageError("--checkpoint: " + unknown_choice(
            "checkpoint", which, [*checkpoints.KINDS, "STEP"]))
    if values.split not in SPLIT_NAMES:
        raise cli.UsageError("--split: " + unknown_choice("split", values.split, SPLIT_NAMES))
    if values.members is not None and values.mode not in ENSEMBLE_MODES:
        raise cli.UsageError(f"--members: --mode={values.mode} does not read it (only "
                             f"{' and '.join('--mode=' + m for m in ENSEMBLE_MODES)})")
    if values.members is not None and not values.members:
        raise cli.UsageError("--members: names no workdir (DIR,DIR,...)")
    if values.mode == "compile" and not values.topology:
        raise cli.UsageError("--mode=compile needs --topology=TYPE (e.g. v5e-8, v4-8, v5p-8, "
                             "v6e-8, v5e-256, h100, h100x8, 2xh100x8)")
    if values.topology and values.mode != "compile":
        raise cli.UsageError(f"--topology: --mode={values.mode} does not read it (only "
                             "--mode=compile)")
    if values.topology:
        from trip_jax.compile import targets
        try:
            targets.target(values.topology)
        except ValueError as err:
            raise cli.UsageError(f"--topology: {err}") from None
    if values.mode == "predict" and not values.input:
        raise cli.UsageError("--mode=predict needs --input=FILE (JSON Lines of story pairs)")


def typed_config(config) -> sections.Config:
    """The typed config of the --config flag (``trip_jax.config.typed``, which checks every
    value); ``cli.UsageError`` naming the first bad key."""
    try:
        return typed(config)
    except ConfigError as err:
        raise cli.UsageError(str(err)) from None


def flags_parser(values: flags.FlagValues = FLAGS):
    """The ``absl.app.run`` flags parser of ``values``: every check above (the config's by
    building it), one line, exit 2."""
    return cli.flags_parser(values, config_check=typed_config, check=check_flags)


def check_devices(config, device_count: int) -> None:
    """``cli.UsageError`` when the mesh sizes do not fit ``device_count`` devices, or when
    ``train.batch_size`` does not split over them (every device gets its own pairs)."""
    from trip_jax.runtime import sharding
    try:
        data, fsdp = sharding.mesh_shape(config.mesh, device_count)
    except ValueError:
        raise cli.UsageError(
            f"bad value for --config.mesh.data, --config.mesh.fsdp: data={config.mesh.data}, "
            f"fsdp={config.mesh.fsdp} (allowed: sizes whose product is the {device_count} "
            f"device{'s' if device_count != 1 else ''}; one of them -1 takes what the other "
            "leaves)") from None
    try:
        sharding.check_batch_split(config.train.batch_size, {"data": data, "fsdp": fsdp})
    except ValueError as error:
        raise cli.UsageError(str(error)) from None


define_flags()
parse_flags = flags_parser(FLAGS)


class _QuietOrbax(std_logging.Filter):
    """Drops orbax's INFO chatter (several lines per checkpoint); keeps its warnings."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        return record.levelno >= std_logging.WARNING or "/orbax/" not in record.pathname


class _HeldInfo(std_logging.Filter):
    """Holds back the records below WARNING in ``held`` (``_start_up`` then shows or drops
    them)."""

    def __init__(self):
        super().__init__()
        self.held: list[std_logging.LogRecord] = []

    def filter(self, record: std_logging.LogRecord) -> bool:
        if record.levelno >= std_logging.WARNING:
            return True
        self.held.append(record)
        return False


@contextlib.contextmanager
def _start_up():
    """The checks that need the devices: their INFO lines (joining the run, the backends) show
    only after they pass; a UsageError is one ``error: ...`` line and exit status 2."""
    handler = logging.get_absl_handler()
    hold = _HeldInfo()
    handler.addFilter(hold)
    try:
        yield
    except cli.UsageError as err:
        hold.held.clear()
        print(f"error: {err}", file=sys.stderr)
        sys.exit(cli.USAGE_EXIT_CODE)
    finally:
        handler.removeFilter(hold)
        for record in hold.held:
            handler.handle(record)


def main(argv) -> None:
    """Prints the config and returns with ``--show_config``; otherwise builds the typed config,
    joins a multi-process run if there is one, checks the config against its devices, then runs
    the selected mode with it (the flags are already parsed and checked by ``parse_flags``)."""
    del argv  # parse_flags refuses extra arguments
    terminal.setup()
    if FLAGS.show_config:  # shows and stops, before any device or workdir is touched
        print(FLAGS.config, flush=True)
        return
    config = typed_config(FLAGS.config)  # checked by parse_flags already: it cannot fail here
    if FLAGS.mode in DATA_MODES:
        try:  # a missing data directory: one line before anything is imported or written
            readers.find_split_files(readers.default_data_dir(config.data.data_dir))
        except readers.TripDataError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(1)
    if FLAGS.mode in ENSEMBLE_MODES:  # an untrained workdir: one line before anything is imported
        missing = checkpoints.untrained(FLAGS.members or [FLAGS.workdir], FLAGS.checkpoint)
        if missing:
            print(f"error: {missing}", file=sys.stderr)
            sys.exit(1)
    import jax
    from trip_jax.runtime import distributed, jax_setup
    jax_setup.quiet_backend_search()
    logging.get_absl_handler().addFilter(_QuietOrbax())
    if FLAGS.mode == "predict" and not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # only the answers and the problems
    with _start_up():  # the devices checked before the modes' imports (flax, transformers, ...)
        distributed.initialize_distributed()
        if FLAGS.mode in TRAINING_MODES:  # the others use the mesh their checkpoint was saved with
            check_devices(config, jax.device_count())
    from etils import epath
    from trip_jax import cross_validate
    from trip_jax.evaluation import model_names
    logging.info("JAX process %d / %d, local devices: %s", jax.process_index(),
                 jax.process_count(), jax.local_devices())
    if FLAGS.mode in TRAINING_MODES:
        where = epath.Path(FLAGS.workdir) / (
            cross_validate.FOLD_DIR.format(fold="F") if FLAGS.mode == "cross_validate" else "")
        logging.info("config: the resolved config goes to %s (--show_config prints it)",
                     where / checkpoints.CONFIG_FILE)
    try:
        jax_setup.configure_jax(config)
        with model_names.named(FLAGS.name):
            MODES[FLAGS.mode](config, FLAGS.workdir)
    except user_errors() as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(getattr(err, "exit_code", 1))  # 2 for a workdir held by another run


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
