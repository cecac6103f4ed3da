"""The spread of a recipe over runs: mean and min-max of the test scores of several workdirs.

``python -m trip_jax.run_summary RUN ... [--out=DIR]`` reads each run's ``reports/test.json`` and
``metrics.jsonl`` (or a RUN ending in ``.json``: that evaluation report, e.g. an ensemble's) and
writes ``DIR/summary.{md,json}``. Details: docs/reference.md#metrics ("Curated and implicit pairs").
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from absl import flags
from etils import epath

from trip_jax import cli
from trip_jax.data import curated
from trip_jax.runtime import paths
from trip_jax.config import migrate
from trip_jax.data import readers
from trip_jax.evaluation.metrics import TIER_METRICS
from trip_jax.evaluation.reports import pct

STATE_F1: tuple[str, ...] = ("precondition_f1", "effect_f1")


def read_run(run_dir: epath.PathLike, data_dir: str | None = None) -> dict[str, Any]:
    """One run's facts (a workdir, or an evaluation report ``.json``): name, seed, selected step
    and epoch, test scores of every decoding, state F1s, held-out scores of the selected step, the wall time (``wall_time`` records) and
    the curated / implicit split (``marker_split``). Raises FileNotFoundError naming the missing
    file."""
    from trip_jax.training import metric_log  # imports JAX: not before the flags are checked
    run = epath.Path(run_dir)
    if run.suffix == ".json":  # an evaluation's report set (e.g. an ensemble's): no training log
        if not run.is_file():
            raise FileNotFoundError(f"{run} is missing")
        report_path, log_path = run, None
        predictions = run.with_name(run.name.removesuffix(".json") + ".predictions.jsonl")
    else:
        report_path, log_path = run / "reports" / "test.json", run / "metrics.jsonl"
        predictions = run / "reports" / "test.predictions.jsonl"
        for path in (report_path, log_path):
            if not path.exists():
                raise FileNotFoundError(f"{path} is missing: is {run} a finished training run?")
    report = metric_log.current_names(json.loads(report_path.read_text()))
    scores = report["metrics"]
    log = metric_log.read_metrics(log_path) if log_path else []
    config_path = run / "config.json"
    seed = (migrate.read_key(json.loads(config_path.read_text()), "train.seed", str(config_path))
            if config_path.exists() else None)
    methods = sorted({k.split("/")[0] for k in scores if k.endswith("/accuracy")}) or [
        scores.get("decoding", "independent")]
    test = {m: {t: scores.get(f"{m}/{t}", scores[t]) for t in TIER_METRICS} for m in methods}
    step = report.get("checkpoint_step")
    held_out = next((r for r in log if r["step"] == step and "verifiability" in r
                     and r["split"] != "test"), {})
    return {
        "run": run.name.removesuffix(".json"), "seed": seed,
        "decoding": scores.get("decoding", "independent"), "step": step,
        "epoch": report.get("epoch"),
        "test": test, **{k: scores[k] for k in STATE_F1},
        "held_out": {t: held_out.get(t) for t in TIER_METRICS},
        "wall_seconds": sum(r["seconds"] for r in log if r["split"] == "wall_time") or None,
        "by_marker": report.get("by_marker") or marker_split(predictions, data_dir),
    }


def marker_split(predictions: epath.Path, data_dir: str | None) -> dict[str, Any]:
    """``curated.marker_split`` of a test report's predictions file (pair ids matched to test
    pairs of ``data_dir``, default ``$TRIP_DATA_DIR``); not found without the data."""
    name = curated.MARKER_FILE.format(split="test")
    data_dir = data_dir or os.environ.get(readers.DATA_DIR_ENV)
    if not data_dir or not predictions.exists():
        return curated.marker_split([], None, name)
    ids, path = None, curated.marker_path(data_dir, "test")
    if os.path.isfile(path):
        ids, path = curated.curated_ids(readers.load_split(data_dir, "test"), data_dir, "test")
    from trip_jax.training import metric_log
    records = metric_log.current_names(paths.read_jsonl(predictions))
    return curated.marker_split(records, ids, os.path.basename(path))


def summarize(run_dirs: Sequence[epath.PathLike], data_dir: str | None = None
              ) -> dict[str, Any]:
    """Reads every run (``read_run``) and adds, per decoding and tier, the mean, min and max
    (and per marker half, "curated" / "implicit", when every run has the marker)."""
    if not run_dirs:
        raise ValueError("no run directories given")
    runs = [read_run(d, data_dir) for d in run_dirs]
    methods = sorted(set.intersection(*(set(r["test"]) for r in runs)))
    spread = {m: {t: _spread([r["test"][m][t] for r in runs]) for t in TIER_METRICS}
              for m in methods}
    for key in STATE_F1:
        spread.setdefault("states", {})[key] = _spread([r[key] for r in runs])
    if all(r["by_marker"]["found"] and all(r["by_marker"][h]["num_pairs"] for h in
                                           curated.SUBSETS) for r in runs):
        spread["by_marker"] = {half: {t: _spread([r["by_marker"][half][t] for r in runs])
                                      for t in TIER_METRICS} for half in curated.SUBSETS}
    return {"runs": runs, "spread": spread, "decoding": runs[0]["decoding"]}


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def markdown(summary: dict[str, Any]) -> str:
    """The summary as Markdown: per-run rows, then mean (min-max) per decoding."""
    runs, spread = summary["runs"], summary["spread"]
    methods = [m for m in spread if m not in ("states", "by_marker")]
    lines = [f"# Test scores over {len(runs)} runs (selected checkpoint)", "",
             f"Headline decoding: `{summary['decoding']}`. Scores in %.", "",
             "| run | seed | step (epoch) | decoding | accuracy | consistency | verifiability "
             "| prec. / eff. F1 | held-out acc / cons / verif | wall (s) |",
             "|---|---:|---|---|---:|---:|---:|---|---|---:|"]
    for r in runs:
        for m in methods:
            t = r["test"][m]
            held = " / ".join(pct(r["held_out"][k]) for k in TIER_METRICS)
            wall = "–" if r["wall_seconds"] is None else f"{r['wall_seconds']:.0f}"
            when = "–" if r["step"] is None else f"{r['step']} ({(r['epoch'] or 0):.0f})"
            lines.append(f"| {r['run']} | {r['seed'] or '–'} | {when} | {m} "
                         f"| {pct(t['accuracy'])} | {pct(t['consistency'])} "
                         f"| {pct(t['verifiability'])} | {pct(r['precondition_f1'])} / "
                         f"{pct(r['effect_f1'])} | {held} | {wall} |")
    lines += ["", "| decoding | accuracy | consistency | verifiability |", "|---|---|---|---|"]
    for m in methods:
        cells = [f"{pct(s['mean'])} ({pct(s['min'])}–{pct(s['max'])})"
                 for s in (spread[m][t] for t in TIER_METRICS)]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    states = spread["states"]
    lines += ["", "State macro-F1 (decoded states), mean (min–max): precondition "
              f"{pct(states['precondition_f1']['mean'])} ({pct(states['precondition_f1']['min'])}"
              f"–{pct(states['precondition_f1']['max'])}), effect "
              f"{pct(states['effect_f1']['mean'])} ({pct(states['effect_f1']['min'])}"
              f"–{pct(states['effect_f1']['max'])})."]
    lines += _marker_lines(summary)
    return "\n".join(lines) + "\n"


def _marker_lines(summary: dict[str, Any]) -> list[str]:
    """Per run and over the runs: the tiers of the curated and the implicit pairs (the
    reported decoding), or "marker not found"."""
    lines = ["", "Curated and implicit pairs (HAR's marker), accuracy / consistency / "
             "verifiability:", "", "| run | curated | implicit |", "|---|---|---|"]
    for r in summary["runs"]:
        marker = r["by_marker"]
        if not marker["found"]:
            lines.append(f"| {r['run']} | marker not found | marker not found |")
            continue
        cells = [f"{' / '.join(pct(marker[h][t]) for t in TIER_METRICS)} "
                 f"({marker[h]['num_pairs']} pairs)" for h in curated.SUBSETS]
        lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    spread = summary["spread"].get("by_marker")
    if spread:
        cells = [" / ".join(f"{pct(spread[h][t]['mean'])} ({pct(spread[h][t]['min'])}–"
                            f"{pct(spread[h][t]['max'])})" for t in TIER_METRICS)
                 for h in curated.SUBSETS]
        lines.append("| mean (min–max) | " + " | ".join(cells) + " |")
    return lines


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags (module docstring); the run directories are its arguments."""
    flags.DEFINE_string("out", None, "where summary.md and summary.json go (default: the runs' "
                        "common parent)", flag_values=values)
    flags.DEFINE_string("data_dir", None, "TRIP data directory with the curated marker, for "
                        "reports without it (default: $TRIP_DATA_DIR)", flag_values=values)


def _check(command: cli.Command) -> None:
    """UsageError for a RUN_DIR that does not exist."""
    for run in command.args:
        message = cli.missing_path("RUN_DIR", run)
        if message:
            raise cli.UsageError(message)


parse_flags = cli.command_parser(define_flags, doc=__doc__, positional="RUN_DIR",
                                 check=_check)


def main(command: cli.Command) -> int:
    """Runs the parsed command (``parse_flags``): RUN_DIR arguments, ``--out``, ``--data_dir``."""
    values, runs = command.values, command.args
    try:
        summary = summarize(runs, values.data_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    folders = [os.path.dirname(r) if r.endswith(".json") else r for r in runs]
    out = epath.Path(values.out or os.path.commonpath([os.path.abspath(r) for r in folders]))
    out.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    paths.write_atomic(out / "summary.md", markdown(summary))
    print(markdown(summary))
    print(f"wrote {out / 'summary.md'} and {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    cli.run(main, parse_flags)
