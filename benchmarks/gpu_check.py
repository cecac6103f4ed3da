"""The GPU check that fits one device lease: every case of a model in one process, JSON after each.

``bash benchmarks/gpu_check.sh OUT_DIR`` on the device; ``python -m benchmarks.gpu_check --smoke
--parity skip --out FILE`` on CPU. Parity tests, matmul peaks, the PyTorch reference, then
trip-jax's cases, within a time budget. Details: benchmarks/README.md#the-gpu-check.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks import cases, flops, report, run, torch_speed, train_speed
from configs import minilm

REPO = Path(__file__).resolve().parents[1]
PARITY_TESTS = ("tests/test_exact_reference.py", "tests/test_bert_parity.py",
                "tests/test_families.py::"
                "test_rows_alone_and_packed_match_torch_from_either_checkpoint_format")
# Parity tests left out where MiniLM's weights are not installed (the device carries its
# tokenizer only: the weights, 87 MB, are over the 64 MiB a device call carries).
NEEDS_MINILM_WEIGHTS = ("tests/test_bert_parity.py::test_minilm_pretrained_parity",)


def deselected_parity_tests() -> dict[str, str]:
    """The parity tests this machine cannot run, and why."""
    try:
        weights = Path(minilm.model_dir()) / "model.safetensors"
    except ImportError:
        return {}  # the test skips itself
    if weights.exists():
        return {}
    return {test: f"no MiniLM weights at {weights}" for test in NEEDS_MINILM_WEIGHTS}


@dataclasses.dataclass
class Budget:
    """Seconds this run may take (``total_s``, from ``started``), of which ``reserve_s`` are
    kept for the parity tests; a case starts only while ``min_case_s`` are left for it."""

    total_s: float
    reserve_s: float
    min_case_s: float
    started: float = dataclasses.field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self.started

    def left(self) -> float:
        """Seconds left of the whole budget."""
        return self.total_s - self.elapsed()

    def case_fits(self) -> bool:
        """Whether another case may start."""
        return self.left() - self.reserve_s >= self.min_case_s


def group_key(case: cases.Case) -> tuple:
    """Cases with the same key share one built model (adjacent in the grid)."""
    if case.layout in cases.TORCH_LAYOUTS:
        return ("torch", case.model)
    return ("jax", case.model, case.layout, case.dtype, case.remat)


class Models:
    """The one built model of the current group: built on a group's first case, released
    (with torch's device cache) when the next group starts."""

    def __init__(self, device: str):
        self.device = device
        self.key, self.built, self.error = None, None, None
        self.built_now = False  # whether the last ``get`` built the model

    def get(self, case: cases.Case, spec: dict):
        """The built model for ``case`` (an exception if building it failed)."""
        key = group_key(case)
        self.built_now = key != self.key
        if self.built_now:
            self.release()
            self.key = key
            try:
                self.built = (torch_speed.build(spec, self.device) if key[0] == "torch"
                              else train_speed.build(spec))
            except Exception as error:  # recorded in every case of the group
                self.error = error
        if self.error is not None:
            raise self.error
        return self.built

    def release(self) -> None:
        """Drops the built model and hands torch's cached device memory back."""
        self.built, self.error = None, None
        gc.collect()
        if self.key and self.key[0] == "torch" and self.device == "cuda":
            torch_speed.torch.cuda.empty_cache()


def measure_case(models: Models, case: cases.Case) -> dict:
    """Times one case on its group's model; its record, or its error."""
    spec = run.case_spec(case)
    start = time.perf_counter()
    try:
        built = models.get(case, spec)
        if group_key(case)[0] == "torch":
            data, model, setup_s = built
            record = torch_speed.measure(data, model, spec, setup_s, models.device)
        else:
            h, setup_s = built
            record = train_speed.measure(h, spec, setup_s)
    except Exception as error:
        record = {"case": spec, "error": f"{type(error).__name__}: {error}"[:2000],
                  "traceback_tail": traceback.format_exc()[-3000:]}
    record["wall_s"] = time.perf_counter() - start
    record["model_built"] = models.built_now  # else: the previous case's model, continued
    return record


# A test's outcome in pytest's verbose output: "tests/test_x.py::test_y[id] PASSED  [ 50%]".
_OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)
_STATUS = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "errors",
           "SKIPPED": "skipped", "XFAIL": "skipped"}


def parity_summary(output: str) -> dict:
    """Passed, failed, errors and skipped tests in pytest's verbose ``output`` (all of it, or
    what came before a time-out), and the names of the failed ones and those in error."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failed_names": []}
    for name, outcome in _OUTCOME.findall(output):
        counts[_STATUS[outcome]] += 1
        if _STATUS[outcome] in ("failed", "errors"):
            counts["failed_names"].append(name)
    return counts


def run_parity(timeout_s: float) -> dict:
    """Runs ``PARITY_TESTS`` in a pytest subprocess (verbose; no xdist, none of the project's
    addopts), interrupted after ``timeout_s``; their ``parity_summary`` (``timed_out``: of the
    tests that finished), or why they did not run."""
    if importlib.util.find_spec("pytest") is None:
        return {"not_run": "pytest is not installed on this machine"}
    if timeout_s < 30:
        return {"not_run": f"{max(timeout_s, 0):.0f} s of the budget left"}
    deselected = deselected_parity_tests()
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-v", "-p", "no:cacheprovider",
               *PARITY_TESTS, *(f"--deselect={test}" for test in deselected)]
    start = time.perf_counter()
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        try:
            output, timed_out = proc.communicate(timeout=timeout_s)[0], False
        except subprocess.TimeoutExpired:
            proc.kill()
            output, timed_out = proc.communicate()[0], True
    return {"files": list(PARITY_TESTS), "deselected": deselected,
            "returncode": proc.returncode, "timed_out": timed_out,
            "wall_s": time.perf_counter() - start, "output_tail": output[-3000:],
            **parity_summary(output)}


def _best(records: list[dict], keep: Callable[[dict], bool]) -> dict | None:
    """The record of ``records`` kept by ``keep`` with the most train pairs/s."""
    timed = [r for r in records if "error" not in r and "train" in r and keep(r)]
    return max(timed, key=lambda r: r["train"]["pairs_per_s"], default=None)


def goals(results: dict) -> list[dict]:
    """``cases.GPU_GOALS`` measured on this run's records (None: not measured)."""
    records = results["cases"]
    paper = _best(records, lambda r: r["layout"] == "config")
    clean = _best(records, lambda r: r["layout"] == "packed_tokens")
    torch = _best(records, lambda r: r["layout"] in cases.TORCH_LAYOUTS)
    parity = results.get("parity_tests") or {}
    measured = {
        "paper_train_compile_s": (paper, paper and paper["train"]["compile_s"]),
        "train_x_torch_best": (clean, clean and torch and (
            clean["train"]["pairs_per_s"] / torch["train"]["pairs_per_s"])),
        "train_mfu_best": (clean, clean and clean["train"].get("mfu")),
        "parity_failures": (None, parity["failed"] + parity["errors"]
                            if "failed" in parity else None),
    }
    result = []
    for key, what, kind, bound in cases.GPU_GOALS:
        record, value = measured[key]
        layout = f"{record['layout']} B={record['batch_size']}" if record else "-"
        result.append(run.judge({"model": record["model"] if record else "-", "layout": layout,
                                 "target": key, "what": what, "kind": kind, "bound": bound,
                                 "measured": value}))
    return result


def _derive(results: dict) -> None:
    results["goals"] = goals(results)


def skip(case: cases.Case, reason: str) -> dict:
    """The ``skipped`` entry of a case not run."""
    return {"model": case.model, "layout": case.layout, "batch_size": case.batch_size,
            "modes": list(case.modes), "reason": reason}


def measure_peaks(grid: cases.Grid, budget: Budget) -> dict:
    """The matmul peak of each of the grid's dtypes, within the budget."""
    peaks = {}
    for dtype in grid.peak_dtypes:
        if budget.case_fits():
            peaks[dtype] = flops.measure_on_device(grid.peak_size, dtype)
    return peaks


def main(argv=None) -> dict:
    """Runs the check (module docstring) and writes its JSON to ``--out``; returns it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the results JSON")
    parser.add_argument("--smoke", action="store_true", help="every case tiny (CPU, seconds)")
    parser.add_argument("--budget-s", type=float, default=440.0,
                        help="seconds for the whole check, parity tests included")
    parser.add_argument("--parity", choices=("first", "last", "skip"), default="first",
                        help="when the parity tests run (first: before any case, so that a "
                        "case cut short by the command's time limit does not take them along)")
    parser.add_argument("--parity-s", type=float, default=150.0,
                        help="seconds the parity tests may take (kept for them when last)")
    parser.add_argument("--min-case-s", type=float, default=45.0,
                        help="a case starts only while this much is left for it")
    parser.add_argument("--models", default=None,
                        help="comma-separated models of the grid to keep ('': parity only)")
    options = parser.parse_args(argv)
    budget = Budget(options.budget_s, options.parity_s if options.parity == "last" else 0.0,
                    options.min_case_s)
    grid = cases.gpu_check_grid(options.smoke)
    if options.models is not None:
        grid = run.narrow(grid, options.models.split(","), None, None, skip_curves=True)
    out = Path(options.out)
    results = {"command": [sys.argv[0], *(sys.argv[1:] if argv is None else argv)],
               "grid": grid.name, "complete": False, "environment": run.environment(),
               "torch_device": torch_speed.default_device(),
               "load_average": {"start": os.getloadavg()},
               "flops_formula": report.FLOPS_FORMULA,
               "options": {k: v for k, v in vars(options).items() if k != "out"},
               "matmul_peak": {"start": {}}, "cases": [], "skipped": [], "epoch_curves": [],
               "parity_tests": {"not_run": f"--parity {options.parity}"}}
    if options.parity == "first":  # before this process takes any device memory
        results["parity_tests"] = run_parity(min(options.parity_s, budget.left()))
    results["matmul_peak"]["start"] = measure_peaks(grid, budget)
    if torch_speed.default_device() == "cuda":
        results["torch_device_name"] = torch_speed.torch.cuda.get_device_name()
    run.save(results, out, budget.started, _derive)
    models = Models(torch_speed.default_device())
    for case in grid.cases:
        if not budget.case_fits():
            results["skipped"].append(skip(case, f"time budget: {budget.left():.0f} s of "
                                                 f"{budget.total_s:.0f} s left"))
            continue
        print(f"case {case.model} {case.layout} B={case.batch_size} {case.dtype or ''} "
              f"{','.join(case.modes)} ({budget.elapsed():.0f} s)", file=sys.stderr, flush=True)
        results["cases"].append(measure_case(models, case))
        run.save(results, out, budget.started, _derive)
    models.release()
    if options.parity == "last":
        results["parity_tests"] = run_parity(budget.left())
    results["load_average"]["end"] = os.getloadavg()
    results["complete"] = True
    run.save(results, out, budget.started, _derive)
    print(results["markdown"])
    return results


if __name__ == "__main__":
    main()
