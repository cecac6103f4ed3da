"""K-fold cross-validation of one config: ``--mode=cross_validate``.

``cross_validate(config, workdir)`` trains once per fold of dev in ``WORKDIR/foldF`` (resuming),
decodes each fold's last checkpoint under every ``cv.sweep`` combination into ``foldF/sweep.json``
and writes ``WORKDIR/cv_summary.*`` and ``cv_sweep.*`` from those files. Test is never read.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
from absl import logging
from etils import epath

from trip_jax import train
from trip_jax.config import sweeps
from trip_jax.config.typed import replace, typed
from trip_jax.data import input_pipeline
from trip_jax.evaluation import cv_summary, decoding, evaluate, metrics
from trip_jax.runtime import paths
from trip_jax.training import checkpoints
from trip_jax.training.metric_log import METRICS_FILE, current_label, current_names, read_metrics

FOLD_DIR = "fold{fold}"
SWEEP_FILE = "sweep.json"


def fold_workdir(workdir: epath.PathLike, fold: int) -> epath.Path:
    """The workdir of one fold's run."""
    return epath.Path(workdir) / FOLD_DIR.format(fold=fold)


def finished(fold_dir: epath.PathLike) -> bool:
    """Whether the run in ``fold_dir`` ran to its end (it logs its wall time only then)."""
    log = epath.Path(fold_dir) / METRICS_FILE
    return log.exists() and any(r.get("split") == "wall_time" for r in paths.read_jsonl(log))


def cross_validate(config, workdir: str) -> dict[str, Any]:
    """Runs every fold of ``config`` (module docstring; typed, or a ConfigDict it is built from,
    ``trip_jax.config.typed``); returns the summary over the folds."""
    config = typed(config)
    folds = config.data.folds
    wanted = _wanted_decodings(config)
    for fold in range(folds):
        fold_dir = fold_workdir(workdir, fold)
        if finished(fold_dir):
            logging.info("fold %d / %d: finished earlier in %s", fold + 1, folds, fold_dir)
        else:
            logging.info("fold %d / %d: training in %s", fold + 1, folds, fold_dir)
            fold_config = replace(config, {"data.protocol": "dev_cv", "data.fold": fold})
            train.train_and_evaluate(fold_config, str(fold_dir))
        if wanted:
            fold_sweep(fold_dir, wanted)
        summary = summarise_folds(workdir, folds, list(wanted), through=fold)
    return summary


def _wanted_decodings(config) -> dict[str, dict[str, Any]]:
    """{label: the whole decoding config} of every ``cv.sweep`` combination over the command's
    decoding keys ({} for an empty sweep)."""
    if not config.cv.sweep:
        return {}
    return {sweeps.label(combination): dataclasses.asdict(dataclasses.replace(
        config.decoding, **{k.removeprefix("decoding."): v for k, v in combination.items()}))
        for combination in sweeps.combinations(config.cv.sweep)}


def fold_sweep(fold_dir: epath.PathLike, wanted: dict[str, dict[str, Any]]) -> None:
    """Makes ``foldF/sweep.json`` hold the held-out scores of every wanted decoding (those it
    lacks, or holds under other decoding keys, decoded from the fold's last checkpoint).
    CheckpointError when one is missing and the checkpoint is gone. Process 0 writes."""
    path = epath.Path(fold_dir) / SWEEP_FILE
    held = _read_sweep(path)
    missing = {label: keys for label, keys in wanted.items()
               if label not in held or held[label]["decoding"] != keys}
    if missing:
        logging.info("fold %s: decoding the held-out fold under %d combinations", fold_dir,
                     len(missing))
        try:
            held.update(_decode_fold(fold_dir, missing))
        except checkpoints.CheckpointError as err:
            raise checkpoints.CheckpointError(
                f"{path} lacks cv.sweep's {next(iter(missing))} and the checkpoint to decode it "
                f"cannot be read ({err}); remove {fold_dir} to train that fold again") from None
        if jax.process_index() == 0:
            paths.write_atomic(path, json.dumps(held, indent=1, sort_keys=True) + "\n")


def _read_sweep(path: epath.Path) -> dict[str, Any]:
    """The records of a fold's sweep file ({} when there is none); ValueError naming it when it
    is not one."""
    if not path.exists():
        return {}
    try:
        held = {current_label(label): record
                for label, record in current_names(json.loads(path.read_text())).items()}
        if not all({"decoding", "scores"} <= set(v) for v in held.values()):
            raise ValueError("a record lacks decoding or scores")
    except (ValueError, AttributeError, TypeError) as err:
        raise ValueError(f"{path}: not a sweep file ({err}); remove it to decode again") from None
    return held


def _decode_fold(fold_dir: epath.Path, decodings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{label: {"decoding", "scores"}}: the fold's last checkpoint run once on its held-out
    fold, decoded under each of ``decodings``."""
    restored = checkpoints.restore_for_eval(str(fold_dir), checkpoints.LATEST)
    splits = input_pipeline.load_splits(restored.config.data)
    evaluator = evaluate.Evaluator.for_checkpoint(restored, splits.selection, restored.config,
                                                  splits=splits)
    arrays = evaluator.predict(restored.params).arrays
    out = {}
    for label, keys in decodings.items():
        config = decoding.DecodingConfig(**keys)
        scores, _, outcomes = evaluate.decoded_metrics(arrays, config)
        chosen = outcomes[config.method]  # the swept key may be the method itself
        records = [{"pair_id": splits.selection[int(i)].pair_id,
                    **metrics.outcome_record(chosen, n)}
                   for n, i in enumerate(arrays["pair_index"])]
        row = evaluate.scalar_metrics(scores)
        row.update(evaluate.marker_scalars(evaluate.marker_split(
            splits, splits.selection_name, splits.selection, records)))
        out[label] = {"decoding": keys, "step": int(restored.step),
                      "scores": cv_summary.with_sum(row)}
    return out


def summarise_folds(workdir: epath.PathLike, folds: int, labels: list[str] | None = None,
                    through: int | None = None) -> dict[str, Any]:
    """Writes ``cv_summary.*`` (per epoch) and, where the folds hold sweep files,
    ``cv_sweep.*`` (per decoding: ``labels``, default every one all of them hold) over the
    finished folds of ``workdir`` (up to fold ``through``), from their files alone; returns
    the per-epoch summary. Process 0 writes."""
    last = folds - 1 if through is None else through
    done = [f for f in range(last + 1) if finished(fold_workdir(workdir, f))]
    if not done:
        raise checkpoints.CheckpointError(f"no fold of {workdir} has finished")
    logs = {f: read_metrics(fold_workdir(workdir, f) / METRICS_FILE) for f in done}
    summary = cv_summary.summarise(logs)
    title = f"{epath.Path(workdir).name}, folds {done} of {folds}"
    final = summary["epochs"][max(summary["epochs"])]
    logging.info("%s, last epoch: accuracy %.3f consistency %.3f verifiability %.3f (means)",
                 title, final["accuracy"]["mean"], final["consistency"]["mean"],
                 final["verifiability"]["mean"])
    held = {f: _read_sweep(fold_workdir(workdir, f) / SWEEP_FILE) for f in done}
    if labels is None:
        labels = sorted(set.intersection(*(set(h) for h in held.values())))
    lacking = [(f, label) for f in done for label in labels if label not in held[f]]
    if lacking:
        fold, label = lacking[0]
        raise ValueError(f"{fold_workdir(workdir, fold) / SWEEP_FILE} lacks the decoding "
                         f"{label}")
    if jax.process_index() != 0:
        return summary
    written = cv_summary.write_summary(workdir, summary, f"Cross-validation in {title}")
    print(f"wrote {written['markdown']} (folds {done} of {folds})")
    if labels:
        by_label = {label: cv_summary.over_folds([held[f][label]["scores"] for f in done])
                    for label in labels}
        text = "\n".join([f"# Decodings of the held-out folds in {title}", "",
                          "Each fold's last checkpoint (mean ± sample std, min-max; %).", "",
                          *cv_summary.table(by_label, "decoding")]) + "\n"
        written = cv_summary.write_files(workdir, cv_summary.SWEEP_STEM,
                                         {"folds": done, "decodings": by_label}, "decodings",
                                         text)
        print(f"wrote {written['markdown']} ({len(by_label)} decodings)")
    return summary
