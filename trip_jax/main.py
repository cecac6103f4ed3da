"""Command line entry: ``python -m trip_jax.main --config=configs/minilm.py --workdir=DIR``.

``--mode=train`` (default) trains, or resumes, in the workdir and then scores the best
checkpoints on test. Config keys are overridden with ``--config.SECTION.KEY=VALUE``; a misspelt
key is an error. Multi-process runs (SLURM, Cloud TPU, explicit TRIP_* variables) are joined
first (``trip_jax.distributed``).
"""

from __future__ import annotations

import logging as std_logging
from collections.abc import Callable
from typing import Any

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from trip_jax import distributed, train

# mode name -> function(config, workdir). Other modes (evaluate, predict, random_baseline)
# register here.
MODES: dict[str, Callable[[Any, str], Any]] = {
    "train": train.train_and_evaluate,
}

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and reports.")
flags.DEFINE_enum("mode", "train", list(MODES), "What to do with the config and workdir.")
config_flags.DEFINE_config_file(
    "config", None, "A config file (configs/*.py[:loss_preset]).", lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])


class _QuietOrbax(std_logging.Filter):
    """Drops orbax's INFO chatter (several lines per checkpoint); keeps its warnings."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        return record.levelno >= std_logging.WARNING or "/orbax/" not in record.pathname


def main(argv) -> None:
    """Joins a multi-process run if there is one, then runs the selected mode."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.get_absl_handler().addFilter(_QuietOrbax())
    distributed.initialize_distributed()
    logging.info("JAX process %d / %d, local devices: %s", jax.process_index(),
                 jax.process_count(), jax.local_devices())
    logging.info("config:\n%s", FLAGS.config)
    MODES[FLAGS.mode](FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
