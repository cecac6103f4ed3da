"""A tiny training run that kills itself with SIGKILL at one chosen point (tests/test_faults.py).

Usage: ``python tests/fault_worker.py WORKDIR DATA_DIR POINT``, with the config of conftest's
``trained_workdir`` (configs/tiny.py, one epoch, synchronous checkpoints). POINT:

- ``none``: no kill, the run ends normally;
- ``step:N``: right after the train step that reaches global step N is dispatched;
- ``save:KIND:STEP``: while checkpoint KIND/STEP is being saved: its files are written to orbax's
  temporary directory, which is not yet committed (renamed);
- ``report``: while ``reports/test.md`` is being written: its temporary file is complete, the
  rename not done.
"""

from __future__ import annotations

import os
import signal
import sys
import types


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str) -> None:
    """Patches the function where ``point`` lies so that the process dies there."""
    from trip_jax import train
    from trip_jax.runtime import paths

    kind, _, where = point.partition(":")
    if kind == "step":
        original_step = train.TrainLoop.train_step

        def train_step(self, local):
            original_step(self, local)
            if self.step == int(where):
                die()

        train.TrainLoop.train_step = train_step
    elif kind == "save":
        from orbax.checkpoint._src.path import atomicity

        name, step = where.split(":")
        original_finalize = atomicity.AtomicRenameTemporaryPath.finalize

        async def finalize(self, *args, **kwargs):
            final = self.get_final()
            if final.name == step and final.parent.name == name:
                die()
            return await original_finalize(self, *args, **kwargs)

        atomicity.AtomicRenameTemporaryPath.finalize = finalize
    elif kind == "report":
        def replace(source, target):
            if os.fspath(target).endswith(os.path.join("reports", "test.md")):
                die()
            os.replace(source, target)

        paths.os = types.SimpleNamespace(**{**vars(os), "replace": replace})
    elif kind != "none":
        raise ValueError(f"unknown kill point {point!r}")


def main(workdir: str, data_dir: str, point: str) -> None:
    from absl import logging

    from configs import tiny
    from trip_jax import train

    logging.set_verbosity(logging.WARNING)
    logging.use_absl_handler()
    config = tiny.get_config()
    config.data.data_dir = data_dir
    config.train.async_checkpoints = False
    config.train.num_epochs = 1
    install(point)
    train.train_and_evaluate(config, workdir)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(*sys.argv[1:])
