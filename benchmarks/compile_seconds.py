"""Compile seconds and program size of the train and eval steps, before and after, in one command.

``python -m benchmarks.compile_seconds --step minilm --out FILE`` measures each case cold in a
fresh process in this tree and in a worktree of ``--before``; ``--report FILE`` prints the table.
Details: benchmarks/README.md#compile-seconds-before-and-after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks import cases, report, run

REPO = run.REPO
BEFORE = "6782769"
# This tree's measuring code, copied over the before tree's (step_profile --compile and the
# _lN models are newer than it); the measured code (trip_jax, configs) stays the before tree's.
OVERLAY = ("benchmarks/step_profile.py", "benchmarks/harness.py", "benchmarks/cases.py")
# The measuring code copied into the before tree: step_profile --compile as first written, before
# the typed config (issue 45), which the before tree's trip_jax lacks.
OVERLAY_COMMIT = "689e710"
TREES = ("before", "after")
# Per-tree fields of a compile record that are medians over ``--repeats``.
SECONDS = ("train_lower_s", "train_compile_s", "eval_lower_s", "eval_compile_s")
# Environment variables that would let a process read or write compiled programs on disk.
_CACHE_VARS = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
               "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES")


def parse_cases(text: str) -> list[dict]:
    """``MODEL:LAYOUT:BATCH[:DTYPE]``, comma-separated, as case dicts."""
    result = []
    for item in filter(None, text.split(",")):
        model, layout, batch, *dtype = item.split(":")
        result.append(case_spec(model, layout, int(batch), dtype[0] if dtype else None))
    return result


def case_spec(model: str, layout: str, batch_size: int, dtype: str | None) -> dict:
    """One case's keys in the JSON."""
    return {"model": model, "layout": layout, "batch_size": batch_size, "dtype": dtype}


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@contextlib.contextmanager
def before_tree(commit: str) -> Iterator[Path]:
    """A detached worktree of ``commit`` in a temporary folder with ``OVERLAY`` as of
    ``OVERLAY_COMMIT`` (measuring code that still runs on the before tree); removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="compile_seconds_"))
    tree = folder / "before"
    _git("worktree", "add", "--detach", str(tree), commit)
    try:
        for path in OVERLAY:
            (tree / path).write_text(_git("show", f"{OVERLAY_COMMIT}:{path}") + "\n")
        yield tree
    finally:
        _git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(folder, ignore_errors=True)


def worker_env(tree: Path) -> dict:
    """This process's environment for a worker in ``tree``: ``tree`` first on the import path
    (not an installed copy), the persistent compilation cache off."""
    env = {k: v for k, v in os.environ.items() if k not in _CACHE_VARS}
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    return env


def compile_record(tree: Path, case: dict, timeout: int) -> dict:
    """``step_profile --compile`` of ``case`` in a fresh process in ``tree``: its record (or
    the error), the process's wall seconds and the load average before it."""
    args = ["--compile", "--model", case["model"], "--layout", case["layout"],
            "--batch-size", str(case["batch_size"])]
    if case["dtype"]:
        args += ["--dtype", case["dtype"]]
    load = os.getloadavg()
    result = run.run_module("benchmarks.step_profile", args, timeout, worker_env(tree), cwd=tree)
    if "error" in result:
        return {**result, "load_average_before": load}
    [record] = result["cases"]
    if not Path(result["trip_jax"]).resolve().is_relative_to(tree.resolve()):
        return {"error": f"imported trip_jax from {result['trip_jax']}, not {tree}",
                "load_average_before": load}
    return {**record, "process_wall_s": result["process_wall_s"], "load_average_before": load}


def step_record(tree: Path, model: str, iters: int, timeout: int) -> dict:
    """``model``'s train and eval steps timed by ``benchmarks.train_speed`` in ``tree``
    (packed_tokens, batch 1, ``iters`` timed steps each): the timings and the batch."""
    case = {"model": model, "layout": "packed_tokens", "batch_size": 1, "iters": iters}
    load = os.getloadavg()
    result = run.run_module("benchmarks.train_speed", ["--case", json.dumps(case)], timeout,
                            worker_env(tree), cwd=tree)
    if "error" in result:
        return {**result, "load_average_before": load}
    keep = ("compile_s", "first_run_s", "step_s", "step_s_all", "cpu_user_s_per_step",
            "cpu_sys_s_per_step", "pairs_per_s")
    return {**{m: {k: result[m][k] for k in keep if k in result[m]}
               for m in ("train", "eval") if m in result},
            "batch": result.get("batch"), "process_wall_s": result["process_wall_s"],
            "load_average_before": load}


def merge(records: list[dict]) -> dict:
    """One tree's records of a case over repeats: the first, with ``SECONDS`` the median and
    ``*_all`` every run's (an error if any run failed)."""
    errors = [r for r in records if "error" in r]
    if errors:
        return errors[0]
    merged = dict(records[0])
    for key in SECONDS:
        merged[key] = statistics.median(r[key] for r in records)
        merged[key + "_all"] = [r[key] for r in records]
    merged["load_average_before"] = [r["load_average_before"] for r in records]
    return merged


def goals(results: dict) -> list[dict]:
    """``cases.COMPILE_GOALS`` judged on what has run (``run.judge``; None: not measured)."""
    after = [c["after"] for c in results["cases"] if "error" not in c.get("after", {"error": 1})]
    paper_model = cases.COMPILE_CASES[0][0]
    paper = [a["train_compile_s"] for a in after if a["model"] == paper_model]
    paper = paper[0] if paper else None
    clean = [a for a in after if a["model"] != paper_model and a["layout"] == "packed_tokens"]
    ratio = None
    if len(clean) > 1:
        shallow, deep = (min(clean, key=lambda a: a["encoder_layers"]),
                         max(clean, key=lambda a: a["encoder_layers"]))
        if deep["encoder_layers"] > shallow["encoder_layers"]:
            ratio = deep["train_step"] / shallow["train_step"]
    step = results.get("step") or {}
    step_ratio = None
    if all("train" in step.get(t, {}) for t in TREES):
        step_ratio = step["after"]["train"]["step_s"] / step["before"]["train"]["step_s"]
    measured = {"paper_train_compile_s": paper, "train_equations_deep_over_shallow": ratio,
                "step_train_after_over_before": step_ratio}
    return [run.judge({"model": "", "layout": "", "target": key, "what": what, "kind": kind,
                       "bound": bound, "measured": measured[key]})
            for key, what, kind, bound in cases.COMPILE_GOALS]


def _pair(case: dict, key: str, fmt: str) -> str:
    """``before / after`` of ``key`` in a case's records ("not measured yet": neither is)."""
    values = []
    for tree in TREES:
        record = case.get(tree)
        if record is None:
            values.append("not measured yet")
        elif "error" in record:
            values.append("error")
        else:
            values.append(format(record[key], fmt))
    return "not measured yet" if case.get("before") is case.get("after") is None else (
        " / ".join(values))


def _planned_model(case: dict) -> tuple[str, str]:
    """(dtype, encoder layers) of a case from its config, where no record has them."""
    try:
        model = cases.model_config(case["model"], dtype=case["dtype"]).model
    except (ValueError, ImportError):
        return case["dtype"] or "", ""
    encoder = model.get("random_encoder")
    return model.dtype, str(encoder.num_hidden_layers) if encoder else ""


def markdown(results: dict) -> str:
    """The README table of a results file (or of the planned cases: "not measured yet")."""
    lines = []
    if "environment" in results:
        env, load = results["environment"], results.get("load_average", {})
        lines.append(
            f"Before {results['trees']['before']['commit']}, after "
            f"{results['trees']['after']['commit']}; {env['nproc']} CPUs (nproc), jax "
            f"{env['jax']}; XLA_FLAGS {env['env'].get('XLA_FLAGS', 'unset')!r}; load average "
            + " to ".join(f"{load[k][0]:.1f}" for k in ("start", "end") if k in load)
            + (f"; total {results['total_s']:.0f} s" if "total_s" in results else "") + ".")
        lines.append("")
    rows = []
    for case in results["cases"]:
        known = case.get("after") or case.get("before") or {}
        dtype, layers = ((known["dtype"], known["encoder_layers"]) if "dtype" in known
                         else _planned_model(case))
        rows.append([case["model"], f"{case['layout']}, {case['batch_size']}", dtype, layers,
                     _pair(case, "train_step", ","), _pair(case, "train_compile_s", ".1f"),
                     _pair(case, "eval_step", ","), _pair(case, "eval_compile_s", ".1f")])
    lines += report.table(["model", "layout, B", "dtype", "encoder layers",
                            "train equations before / after", "train compile s before / after",
                            "eval equations before / after", "eval compile s before / after"],
                           rows)
    step = results.get("step")
    if step:
        lines.append("")
        parts = []
        for mode in ("train", "eval"):
            times = [step.get(t, {}).get(mode, {}).get("step_s") for t in TREES]
            if any("error" in step.get(t, {}) for t in TREES):
                parts.append(f"{mode}: error")
            elif None in times:
                parts.append(f"{mode} not measured")
            else:
                parts.append(f"{mode} {times[0]:.3g} s before, {times[1]:.3g} s after "
                             f"({times[1] / times[0]:.2f}x)")
        lines.append(f"{step['model']} steady-state step (packed_tokens, B=1, median of "
                     f"{step['iters']}): " + "; ".join(parts) + "." if step["iters"] else
                     f"{step['model']} steady-state step (packed_tokens, B=1): not measured yet.")
    if "goals" in results:
        lines.append("")
        lines += report.table(["goal", "measured", "bound", "status"],
                               [row[2:] for row in report.target_rows(results["goals"])])
    return "\n".join(lines)


def planned(case_list: list[dict], step: str | None = None) -> dict:
    """A results skeleton of ``case_list`` (nothing measured)."""
    result = {"cases": [dict(c) for c in case_list]}
    if step:
        result["step"] = {"model": step, "iters": 0}
    return result


def save(results: dict, out: Path, started: float) -> None:
    """Goals, table and elapsed seconds of what has run so far, written to ``out``."""
    results["goals"] = goals(results)
    results["total_s"] = time.perf_counter() - started
    results["markdown"] = markdown(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


def environment() -> dict:
    """``run.environment`` and the CPUs ``nproc`` reports."""
    return {**run.environment(), "nproc": int(subprocess.run(
        ["nproc"], capture_output=True, text=True, check=True).stdout)}


def measure(options, out: Path) -> dict:
    """Runs every case (and the step model) in both trees; returns the results written."""
    started = time.perf_counter()
    case_list = parse_cases(options.cases) if options.cases else [
        case_spec(*c) for c in cases.COMPILE_CASES]
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=REPO).returncode != 0
    results = {
        "what": "jaxpr equations and compile seconds of the train and eval steps "
                "(benchmarks.step_profile --compile: .lower().compile() on the train state's "
                "shapes, nothing run, one process per case and tree, persistent cache off), "
                "before and after",
        "command": ["python -m benchmarks.compile_seconds",
                    *(sys.argv[1:] if options.argv is None else options.argv)],
        "complete": False, "environment": environment(),
        "load_average": {"start": os.getloadavg()},
        "trees": {"before": {"commit": options.before, "overlay": list(OVERLAY),
                            "overlay_commit": OVERLAY_COMMIT},
                  "after": {"commit": _git("rev-parse", "--short", "HEAD"),
                            "uncommitted_changes": dirty}},
        "repeats": options.repeats, "cases": planned(case_list)["cases"]}
    with before_tree(options.before) as tree:
        trees = {"before": tree, "after": REPO}
        records = [{t: [] for t in TREES} for _ in case_list]
        for repeat in range(options.repeats):
            for i, case in enumerate(case_list):
                order = TREES if (i + repeat) % 2 == 0 else TREES[::-1]
                for name in order:
                    print(f"{name}: {case['model']} {case['layout']} B={case['batch_size']} "
                          f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
                    records[i][name].append(compile_record(trees[name], case, options.timeout))
                    results["cases"][i][name] = merge(records[i][name])
                    save(results, out, started)
        if options.step:
            results["step"] = {"model": options.step, "iters": options.step_iters}
            for name in TREES:
                print(f"{name}: {options.step} steady-state step", file=sys.stderr, flush=True)
                results["step"][name] = step_record(trees[name], options.step,
                                                    options.step_iters, options.timeout)
                save(results, out, started)
    results["load_average"]["end"] = os.getloadavg()
    results["complete"] = True
    save(results, out, started)
    return results


def main(argv=None) -> dict | None:
    """Parses flags; measures and writes the JSON, or prints a file's table (``--report``) or
    the planned table (``--report`` with ``--planned``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/compile_seconds.json")
    parser.add_argument("--before", default=BEFORE, help="the before commit")
    parser.add_argument("--cases", default=None,
                        help="MODEL:LAYOUT:BATCH[:DTYPE],... (default: cases.COMPILE_CASES)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each case per tree (the JSON keeps the medians)")
    parser.add_argument("--step", default=None,
                        help="also time this model's steady-state steps in both trees")
    parser.add_argument("--step-iters", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per process")
    parser.add_argument("--report", default=None, metavar="JSON",
                        help="print the table of a results file instead of measuring")
    parser.add_argument("--planned", action="store_true",
                        help="print the table of the planned cases, nothing measured")
    options = parser.parse_args(argv)
    options.argv = argv
    if options.planned:
        case_list = parse_cases(options.cases) if options.cases else [
            case_spec(*c) for c in cases.COMPILE_CASES]
        print(markdown(planned(case_list, options.step)))
        return None
    if options.report:
        print(markdown(json.loads(Path(options.report).read_text())))
        return None
    results = measure(options, Path(options.out))
    print(results["markdown"])
    print(f"wrote {options.out} in {results['total_s']:.0f} s", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
