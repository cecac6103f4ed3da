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

# Issue 45 stage 3 renamed the decoding "reference" (each tier on its own) to "independent" and
# the decoding key conflict_weight to detector_weight. Records written before (the committed
# runs of results/) keep the old names; they are not rewritten: whatever reads saved records
# (metrics.jsonl, a report's metrics, a fold's sweep file) reads them through current_names
# (and a sweep file's labels through current_label).
OLD_DECODINGS = {"reference": "independent"}
OLD_DECODING_KEYS = {"conflict_weight": "detector_weight"}


def current_names(value: Any) -> Any:
    """A saved record (or a list of them, nested at any depth) under today's names: a key
    "reference/X" as "independent/X", a "decoding" value or a "by_decoding" key "reference" as
    "independent", a "decoding" dict's conflict_weight as detector_weight; the rest unchanged."""
    if isinstance(value, list):
        return [current_names(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if isinstance(key, str) and key.split("/", 1)[0] in OLD_DECODINGS and "/" in key:
            method, rest = key.split("/", 1)
            key = f"{OLD_DECODINGS[method]}/{rest}"
        if key == "decoding" and isinstance(item, str):
            item = OLD_DECODINGS.get(item, item)
        elif key == "decoding" and isinstance(item, dict):
            item = {OLD_DECODING_KEYS.get(k, k): v for k, v in item.items()}
            if isinstance(item.get("method"), str):
                item["method"] = OLD_DECODINGS.get(item["method"], item["method"])
        elif key == "by_decoding" and isinstance(item, dict):
            item = {OLD_DECODINGS.get(k, k): v for k, v in item.items()}
        out[key] = current_names(item)
    return out


def current_label(label: str) -> str:
    """A cv sweep label (``KEY=VALUE, ...``, ``config.sweeps.label``) under today's names: key
    conflict_weight as detector_weight, ``method=reference`` as ``method=independent``."""
    parts = []
    for part in label.split(", "):
        key, sep, value = part.partition("=")
        key = OLD_DECODING_KEYS.get(key, key)
        parts.append(key + sep + (OLD_DECODINGS.get(value, value) if key == "method" else value))
    return ", ".join(parts)


def read_metrics(path: epath.PathLike) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` written by any trip_jax, under today's names
    (``current_names``)."""
    return current_names(paths.read_jsonl(path))


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
