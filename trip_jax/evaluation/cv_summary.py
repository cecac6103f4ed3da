"""Cross-validation summaries: the held-out fold's metrics of every fold, per epoch, over folds.

``summarise(fold_logs)`` takes each fold's ``metrics.jsonl`` records and gives, per epoch and
held-out metric, the mean, sample standard deviation, min, max and fold count;
``write_summary`` writes ``cv_summary.{json,md}``. Nothing here knows about JAX.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from trip_jax.runtime import paths

HELD_OUT = "dev_fold"
SUMMARY_STEM = "cv_summary"
SWEEP_STEM = "cv_sweep"
_NOT_METRICS = ("step", "epoch", "time", "split", "checkpoint", "selection_score")
# The columns of the Markdown table, in order (each as mean ± std (min-max) in %).
TABLE_METRICS = ("accuracy", "consistency", "verifiability", "consistency+verifiability",
                 "precondition_f1", "effect_f1", "curated/accuracy", "curated/consistency",
                 "curated/verifiability", "implicit/accuracy", "implicit/consistency",
                 "implicit/verifiability")


def held_out_by_epoch(records: Sequence[Mapping[str, Any]]) -> dict[float, dict[str, float]]:
    """{epoch: the numeric metrics of the held-out evaluation at that epoch} of one fold's log;
    "consistency+verifiability" added (the sum the recipe's choices are judged by)."""
    out = {}
    for record in records:
        if record.get("split") != HELD_OUT:
            continue
        out[round(float(record["epoch"]), 4)] = with_sum(
            {k: float(v) for k, v in record.items()
             if k not in _NOT_METRICS and isinstance(v, (int, float))})
    return out


def with_sum(values: dict[str, float]) -> dict[str, float]:
    """``values`` with "consistency+verifiability" added where both are present."""
    if "consistency" in values and "verifiability" in values:
        values["consistency+verifiability"] = values["consistency"] + values["verifiability"]
    return values


def summarise(fold_logs: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """{"folds": [fold numbers], "epochs": {epoch: ``over_folds`` of that epoch}} of the folds'
    held-out evaluations; an epoch missing from a fold counts the folds that have it (``n``)."""
    per_fold = {fold: held_out_by_epoch(records) for fold, records in sorted(fold_logs.items())}
    epochs = sorted({e for by_epoch in per_fold.values() for e in by_epoch})
    return {"folds": sorted(per_fold),
            "epochs": {epoch: over_folds([by_epoch[epoch] for by_epoch in per_fold.values()
                                          if epoch in by_epoch]) for epoch in epochs}}


def over_folds(rows: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """{metric: {mean, std (ddof 1; 0 for one fold), min, max, n}} of one value per fold."""
    names = sorted({k for row in rows for k in row})
    return {name: _stats([row[name] for row in rows if name in row]) for name in names}


def _stats(values: Sequence[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1
            else 0.0, "min": float(array.min()), "max": float(array.max()), "n": len(array)}


def table(rows: Mapping[Any, Mapping[str, Mapping[str, float]]], first: str) -> list[str]:
    """Markdown table lines: one row per ``rows`` entry (labelled in column ``first``), the
    ``TABLE_METRICS`` as mean ± std (min-max) in %."""
    lines = [f"| {first} | folds | " + " | ".join(TABLE_METRICS) + " |",
             "|---" * (len(TABLE_METRICS) + 2) + "|"]
    for label, metrics in rows.items():
        cells = []
        for name in TABLE_METRICS:
            s = metrics.get(name)
            cells.append("–" if s is None else
                         f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f} "
                         f"({100 * s['min']:.1f}-{100 * s['max']:.1f})")
        n = max((s["n"] for s in metrics.values()), default=0)
        lines.append(f"| {label:g} | {n} | " if isinstance(label, float) else
                     f"| {label} | {n} | ")
        lines[-1] += " | ".join(cells) + " |"
    return lines


def markdown(summary: Mapping[str, Any], title: str) -> str:
    """The summary as a Markdown table: one row per epoch (``table``)."""
    lines = [f"# {title}", "",
             f"Held-out fold scores over folds {summary['folds']} (mean ± sample std, min-max; "
             "%). Every metric of every epoch: cv_summary.json.", "",
             *table(summary["epochs"], "epoch")]
    return "\n".join(lines) + "\n"


def write_summary(out_dir: epath.PathLike, summary: Mapping[str, Any], title: str
                  ) -> dict[str, epath.Path]:
    """Writes ``cv_summary.json`` and ``cv_summary.md`` in ``out_dir``; returns their paths."""
    return write_files(out_dir, SUMMARY_STEM, summary, "epochs", markdown(summary, title))


def write_files(out_dir: epath.PathLike, stem: str, summary: Mapping[str, Any], rows_key: str,
                text: str) -> dict[str, epath.Path]:
    """Writes ``summary`` as ``STEM.json`` (the keys of ``summary[rows_key]`` as strings) and
    ``text`` as ``STEM.md`` in ``out_dir``, each whole or not at all; returns their paths."""
    out = epath.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = {str(k): m for k, m in summary[rows_key].items()}
    return {"json": paths.write_atomic(out / f"{stem}.json", json.dumps(
                {**summary, rows_key: rows}, indent=1, sort_keys=True) + "\n"),
            "markdown": paths.write_atomic(out / f"{stem}.md", text)}
