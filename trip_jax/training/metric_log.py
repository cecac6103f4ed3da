"""Logging a run's scalars: ``WORKDIR/metrics.jsonl`` and TensorBoard event files."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from absl import logging
from etils import epath

from trip_jax.runtime import paths

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


class MetricLog:
    """Writes scalars to ``workdir/metrics.jsonl`` and TensorBoard (process 0 only)."""

    def __init__(self, workdir: str | os.PathLike):
        self.enabled = jax.process_index() == 0
        self.path = epath.Path(workdir) / METRICS_FILE
        self.writer = None
        if self.enabled:
            # Through epath, so a gs:// workdir gets its event files too.
            self.writer = paths.summary_writer(epath.Path(workdir) / TENSORBOARD_DIR)

    def write(self, step: int, split: str, scalars: Mapping[str, Any], **extra) -> None:
        """Logs one event: ``split`` is "train", the selection split's name, or "test"."""
        if not self.enabled:
            return
        record = {"step": step, "split": split, **extra, **paths.to_jsonable(dict(scalars)),
                  "time": time.time()}
        # Object stores cannot append: paths.append_text rewrites the file there.
        paths.append_text(self.path, json.dumps(record, allow_nan=False) + "\n")
        for key, value in scalars.items():
            if value is not None and np.isfinite(value):
                self.writer.add_scalar(f"{split}/{key}", value, step)
        self.writer.flush()

    def drop_after(self, step: int) -> None:
        """Removes the records of steps after ``step``: an interrupted run logged them after its
        last checkpoint, and the run resumed from ``step`` logs them again. A last line without
        its newline (a write cut short) is cut off, with a warning."""
        if not self.enabled or not self.path.exists():
            return
        text = self.path.read_text()
        lines = text.splitlines()
        if text and not text.endswith("\n"):
            logging.warning("%s ended in a partial line (a write cut short); cut off: %.80r",
                            self.path, lines.pop())
        kept = [line for line in lines if json.loads(line)["step"] <= step]
        if len(kept) < len(lines):
            logging.info("metrics.jsonl: dropped %d records after step %d (logged again on "
                         "resume)", len(lines) - len(kept), step)
        if "".join(line + "\n" for line in kept) != text:
            paths.write_atomic(self.path, "".join(line + "\n" for line in kept))

    def close(self) -> None:
        """Closes the TensorBoard writer."""
        if self.writer is not None:
            self.writer.close()
