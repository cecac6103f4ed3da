"""The spread of a recipe over runs: mean and min-max of the test scores of several workdirs.

``python -m trip_jax.run_summary RUN_DIR [RUN_DIR ...] [--out=DIR]`` reads each run's
``reports/test.json`` (the selected checkpoint's test report, written at the end of training)
and ``metrics.jsonl`` (its held-out evaluations and wall time), and writes ``DIR/summary.md`` and
``DIR/summary.json`` (default DIR: the runs' common parent): one row per run, then the mean and
the min-max over the runs, for every decoding the reports hold. A run's wall time is the sum of
its ``wall_time`` records (one per training process; setup, compilation and test scoring
included). Nothing is computed from
anything but those files, so a summary can be re-derived from what ``results/`` keeps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from etils import epath

from trip_jax import paths
from trip_jax.metrics import TIER_METRICS

STATE_F1: tuple[str, ...] = ("precondition_f1", "effect_f1")


def read_run(run_dir: epath.PathLike) -> dict[str, Any]:
    """One run's facts: name, seed, selected step and epoch, test scores of every decoding,
    state F1s, held-out scores of the selected step and the wall time (``wall_time`` records).
    Raises FileNotFoundError naming the missing file."""
    run = epath.Path(run_dir)
    report_path, log_path = run / "reports" / "test.json", run / "metrics.jsonl"
    for path in (report_path, log_path):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: is {run} a finished training run?")
    report = json.loads(report_path.read_text())
    scores = report["metrics"]
    log = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    config = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    methods = sorted({k.split("/")[0] for k in scores if k.endswith("/accuracy")}) or [
        scores.get("decoding", "reference")]
    test = {m: {t: scores.get(f"{m}/{t}", scores[t]) for t in TIER_METRICS} for m in methods}
    step = report.get("checkpoint_step")
    held_out = next((r for r in log if r["step"] == step and "verifiability" in r
                     and r["split"] != "test"), {})
    return {
        "run": run.name, "seed": config.get("train", {}).get("seed"),
        "decoding": scores.get("decoding", "reference"), "step": step,
        "epoch": report.get("epoch"),
        "test": test, **{k: scores[k] for k in STATE_F1},
        "held_out": {t: held_out.get(t) for t in TIER_METRICS},
        "wall_seconds": sum(r["seconds"] for r in log if r["split"] == "wall_time") or None,
    }


def summarize(run_dirs: Sequence[epath.PathLike]) -> dict[str, Any]:
    """Reads every run (``read_run``) and adds, per decoding and tier, the mean, min and max."""
    if not run_dirs:
        raise ValueError("no run directories given")
    runs = [read_run(d) for d in run_dirs]
    methods = sorted(set.intersection(*(set(r["test"]) for r in runs)))
    spread = {m: {t: _spread([r["test"][m][t] for r in runs]) for t in TIER_METRICS}
              for m in methods}
    for key in STATE_F1:
        spread.setdefault("states", {})[key] = _spread([r[key] for r in runs])
    return {"runs": runs, "spread": spread, "decoding": runs[0]["decoding"]}


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def markdown(summary: dict[str, Any]) -> str:
    """The summary as Markdown: per-run rows, then mean (min-max) per decoding."""
    runs, spread = summary["runs"], summary["spread"]
    methods = [m for m in spread if m != "states"]
    lines = [f"# Test scores over {len(runs)} runs (selected checkpoint)", "",
             f"Headline decoding: `{summary['decoding']}`. Scores in %.", "",
             "| run | seed | step (epoch) | decoding | accuracy | consistency | verifiability "
             "| prec. / eff. F1 | held-out acc / cons / verif | wall (s) |",
             "|---|---:|---|---|---:|---:|---:|---|---|---:|"]
    for r in runs:
        for m in methods:
            t = r["test"][m]
            held = " / ".join(_pct(r["held_out"][k]) for k in TIER_METRICS)
            wall = "–" if r["wall_seconds"] is None else f"{r['wall_seconds']:.0f}"
            lines.append(f"| {r['run']} | {r['seed']} | {r['step']} ({r['epoch']:.0f}) | {m} "
                         f"| {_pct(t['accuracy'])} | {_pct(t['consistency'])} "
                         f"| {_pct(t['verifiability'])} | {_pct(r['precondition_f1'])} / "
                         f"{_pct(r['effect_f1'])} | {held} | {wall} |")
    lines += ["", "| decoding | accuracy | consistency | verifiability |", "|---|---|---|---|"]
    for m in methods:
        cells = [f"{_pct(s['mean'])} ({_pct(s['min'])}–{_pct(s['max'])})"
                 for s in (spread[m][t] for t in TIER_METRICS)]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    states = spread["states"]
    lines += ["", "State macro-F1 (decoded states), mean (min–max): precondition "
              f"{_pct(states['precondition_f1']['mean'])} ({_pct(states['precondition_f1']['min'])}"
              f"–{_pct(states['precondition_f1']['max'])}), effect "
              f"{_pct(states['effect_f1']['mean'])} ({_pct(states['effect_f1']['min'])}"
              f"–{_pct(states['effect_f1']['max'])})."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m trip_jax.run_summary",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="finished training workdirs")
    parser.add_argument("--out", help="where summary.md and summary.json go "
                                      "(default: the runs' common parent)")
    args = parser.parse_args(argv)
    try:
        summary = summarize(args.runs)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    out = epath.Path(args.out or os.path.commonpath([os.path.abspath(r) for r in args.runs]))
    out.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    paths.write_atomic(out / "summary.md", markdown(summary))
    print(markdown(summary))
    print(f"wrote {out / 'summary.md'} and {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
