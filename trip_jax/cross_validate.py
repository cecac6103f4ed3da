"""K-fold cross-validation of one config: ``--mode=cross_validate``.

``cross_validate(config, workdir)`` trains the config once per fold of dev (protocol ``dev_cv``,
``trip_jax.data.protocol.cv_folds``) in ``WORKDIR/foldF``, one fold after another, skipping the
folds already finished and resuming an interrupted one; then writes the held-out scores of every
epoch over the folds (``trip_jax.evaluation.cv_summary``) as ``WORKDIR/cv_summary.{json,md}``.
``sweep_decoding(config, workdir, key, values)`` scores each fold's last checkpoint on its
held-out fold under every value of one decoding key (the model runs once per fold) and writes
``WORKDIR/cv_sweep.KEY.{json,md}``. Test is never read.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from absl import logging

from trip_jax import cli, train
from trip_jax.config import checks
from trip_jax.config.sections import KEYS
from trip_jax.data import input_pipeline
from trip_jax.evaluation import cv_summary, decoding, evaluate, metrics
from trip_jax.training import checkpoints
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


def parse_sweep(text: str, config) -> tuple[str, list[Any]]:
    """``KEY=V1,V2,...`` (a ``decoding`` key, its values) -> ("decoding.KEY", typed values);
    ``cli.UsageError`` naming the key or value that is not allowed."""
    name, _, listed = text.partition("=")
    dotted = f"decoding.{name.strip().removeprefix('decoding.')}"
    if dotted not in KEYS or not listed.strip():
        decoding_keys = [k.removeprefix("decoding.") for k in KEYS if k.startswith("decoding.")]
        raise cli.UsageError(f"--sweep: expected KEY=V1,V2,... with KEY one of "
                             f"{', '.join(decoding_keys)}; got {text!r}")
    kind = type(KEYS[dotted].default)
    values = []
    for raw in (v.strip() for v in listed.split(",")):
        value = _typed(raw, kind)
        problem = f"a {kind.__name__}" if value is None else KEYS[dotted].problem(value)
        if problem:
            raise cli.UsageError("--sweep: " + checks.bad_value(dotted, raw, problem))
        values.append(value)
    return dotted, values


def _typed(raw: str, kind: type) -> Any:
    """``raw`` as a value of ``kind`` (bool: true/false/1/0), None when it is not one."""
    if kind is bool:
        return {"true": True, "1": True, "false": False, "0": False}.get(raw.lower())
    try:
        return kind(raw)
    except ValueError:
        return None


def _fold_outputs(fold_dir: str):
    """(the eval-step outputs, the protocol splits) of a fold's last checkpoint on its held-out
    fold."""
    restored = checkpoints.restore_for_eval(fold_dir, checkpoints.LATEST)
    splits = input_pipeline.load_splits(restored.config.data)
    evaluator = evaluate.Evaluator.for_checkpoint(restored, splits.selection, restored.config,
                                                  splits=splits)
    return evaluator.predict(restored.params).arrays, splits


def sweep_decoding(config, workdir: str, dotted: str, values: list[Any]) -> dict[str, Any]:
    """Scores every finished fold's last checkpoint (the others are named in a warning and in
    the table) under each value of ``dotted`` (a decoding key), the other decoding keys as the
    command's ``config`` sets them (``--config.decoding.KEY=...`` fixes another key); writes
    ``WORKDIR/cv_sweep.KEY.{json,md}`` and returns {"key", "folds", "values": {value: ``cv_summary.over_folds``}}."""
    key = dotted.removeprefix("decoding.")
    base = decoding.DecodingConfig.from_mapping(config.decoding)
    rows: dict[Any, list[dict[str, float]]] = {value: [] for value in values}
    folds = [f for f in range(config.data.folds) if finished(fold_workdir(workdir, f))]
    unfinished = sorted(set(range(config.data.folds)) - set(folds))
    if not folds:
        raise checkpoints.CheckpointError(f"--sweep: no fold of {workdir} has finished")
    if unfinished:
        logging.warning("--sweep: folds %s have not finished; scoring folds %s only",
                        unfinished, folds)
    for fold in folds:
        arrays, splits = _fold_outputs(fold_workdir(workdir, fold))
        for value in values:
            swept = dataclasses.replace(base, **{key: value})
            scores, _, outcomes = evaluate.decoded_scores(arrays, swept)
            chosen = outcomes[swept.method]  # the swept key may be the method itself
            records = [{"pair_id": splits.selection[int(i)].pair_id,
                        **metrics.outcome_record(chosen, n)}
                       for n, i in enumerate(arrays["pair_index"])]
            row = evaluate.scalar_metrics(scores)
            row.update(evaluate.marker_scalars(evaluate.marker_split(
                splits, splits.selection_name, splits.selection, records)))
            rows[value].append(cv_summary.with_sum(row))
        logging.info("--sweep: fold %d / %d scored under %d values of %s", fold + 1,
                     len(folds), len(values), dotted)
    summary = {"key": dotted, "folds": folds, "unfinished_folds": unfinished,
               "values": {value: cv_summary.over_folds(r) for value, r in rows.items()}}
    text = "\n".join([f"# {dotted} on the held-out folds of {workdir}", "",
                      f"Each fold's last checkpoint, folds {folds} (mean ± sample std, "
                      "min-max; %)" + (f"; folds {unfinished} had not finished" if unfinished
                                       else "") + ".", "",
                      *cv_summary.table(summary["values"], key)]) + "\n"
    written = cv_summary.write_files(workdir, f"cv_sweep.{key}", summary, "values", text)
    print(f"wrote {written['markdown']} and {os.path.basename(written['json'])}")
    return summary
