"""K-fold cross-validation of one config: ``--mode=cross_validate``.

``cross_validate(config, workdir)`` trains the config once per fold of dev (protocol ``dev_cv``,
``trip_jax.data.protocol.cv_folds``) in ``WORKDIR/foldF``, one fold after another, skipping the
folds already finished and resuming an interrupted one; then writes the held-out scores of every
epoch over the folds (``trip_jax.evaluation.cv_summary``) as ``WORKDIR/cv_summary.{json,md}``.
Test is never read.
"""

from __future__ import annotations

import os
from typing import Any

from absl import logging

from trip_jax import train
from trip_jax.evaluation import cv_summary
from trip_jax.training.metric_log import METRICS_FILE

FOLD_DIR = "fold{fold}"


def fold_workdir(workdir: str, fold: int) -> str:
    """The workdir of one fold's run."""
    return os.path.join(workdir, FOLD_DIR.format(fold=fold))


def finished(fold_dir: str) -> bool:
    """Whether the run in ``fold_dir`` ran to its end (it logs its wall time only then)."""
    log = os.path.join(fold_dir, METRICS_FILE)
    return os.path.exists(log) and any(r.get("split") == "wall_time"
                                       for r in cv_summary.read_log(log))


def cross_validate(config, workdir: str) -> dict[str, Any]:
    """Runs every fold of ``config`` (module docstring); returns the summary."""
    folds = config.data.folds
    logs = {}
    for fold in range(folds):
        fold_dir = fold_workdir(workdir, fold)
        if finished(fold_dir):
            logging.info("fold %d / %d: finished earlier in %s", fold + 1, folds, fold_dir)
        else:
            logging.info("fold %d / %d: training in %s", fold + 1, folds, fold_dir)
            fold_config = config.copy_and_resolve_references()
            fold_config.data.protocol = "dev_cv"
            fold_config.data.fold = fold
            train.train_and_evaluate(fold_config, fold_dir)
        logs[fold] = cv_summary.read_log(os.path.join(fold_dir, METRICS_FILE))
    summary = cv_summary.summarise(logs)
    written = cv_summary.write_summary(workdir, summary, f"Cross-validation of {workdir}")
    last = summary["epochs"][max(summary["epochs"])]
    logging.info("%d folds, last epoch: accuracy %.3f consistency %.3f verifiability %.3f "
                 "(means); %s", folds, last["accuracy"]["mean"], last["consistency"]["mean"],
                 last["verifiability"]["mean"], written["markdown"])
    print(f"wrote {written['markdown']} and {os.path.basename(written['json'])}")
    return summary
