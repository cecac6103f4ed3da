"""Train/eval throughput, MFU, memory, compile time and epoch time of the tiered model: one command.

``python -m benchmarks.run --out FILE`` (``--smoke``: seconds) runs every case of a grid
(``benchmarks.cases``) in its own process and writes one JSON with ratios, targets and tables;
the GPU's runner is ``benchmarks.gpu_check``. Details: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import gpu_memory, report
from benchmarks.cases import (LAYOUTS, REFERENCE_LAYOUT, TARGETS, TARGETS_MODEL, TORCH_LAYOUTS,
                              Case, Curve, Grid, select_grid)

REPO = Path(__file__).resolve().parents[1]
# Per-case worker modules (``harness.case_main``): the eager PyTorch reference's layouts, and
# trip-jax's (``cases.LAYOUTS``).
TORCH_WORKER, TRIP_JAX_WORKER = "benchmarks.torch_speed", "benchmarks.train_speed"


def worker(case: Case) -> str:
    """The module that times ``case`` in its own process."""
    return TORCH_WORKER if case.layout in TORCH_LAYOUTS else TRIP_JAX_WORKER


def narrow(grid: Grid, models: list[str] | None, batch_sizes: list[int] | None,
           layouts: list[str] | None, skip_curves: bool) -> Grid:
    """Keeps only the given models, batch sizes (the reference layout's is 1) and layouts."""
    def keep(item):
        return ((models is None or item.model in models)
                and (batch_sizes is None or item.batch_size in batch_sizes)
                and (layouts is None or item.layout in layouts))

    return dataclasses.replace(
        grid, cases=tuple(filter(keep, grid.cases)), skipped=tuple(filter(keep, grid.skipped)),
        curves=() if skip_curves else tuple(filter(keep, grid.curves)))


def run_module(module: str, args: list[str], timeout: int, env: dict,
                cwd: Path = REPO) -> dict:
    """Runs ``python -m module args --out FILE`` in ``cwd`` (default: this tree) and returns
    the JSON it wrote, or an error."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", module, *args, "--out", out],
                                  cwd=cwd, env=env, timeout=timeout, capture_output=True,
                                  text=True)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s"}
        wall_s = time.perf_counter() - start
        if proc.returncode != 0 or not os.path.exists(out):
            return {"error": f"exit status {proc.returncode}", "stderr_tail": proc.stderr[-3000:]}
        with open(out) as f:
            result = json.load(f)
    result["process_wall_s"] = wall_s
    return result


def environment() -> dict:
    """The versions, the machine and the XLA/JAX/allocator settings of this process."""
    import flax
    import jax
    import jaxlib

    return {"python": platform.python_version(), "jax": jax.__version__,
            "jaxlib": jaxlib.__version__, "flax": flax.__version__,
            "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "memory_total_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
            "platform": platform.platform(),
            # Settings that change XLA or the allocator, inherited by every process.
            "env": {k: v for k, v in os.environ.items()
                    if k.startswith(("XLA_", "JAX_", "GLIBC_", "MALLOC_", "LD_PRELOAD"))}}


def _run_recorded(label: str, module: str, args: list[str], key: str, spec, options, env) -> dict:
    """Runs one benchmark module in its own process; returns its record with spec and load."""
    load = os.getloadavg()
    print(f"{label} (load {load[0]:.1f})", file=sys.stderr, flush=True)
    record = run_module(module, args, options.timeout, env)
    record.setdefault(key, dataclasses.asdict(spec))
    record["load_average_before"] = load
    return record


# A case that only compiles memory plans compiles without LLVM's optimisations: XLA assigns
# the buffers before them (the same temp and argument bytes, checked on roberta_l1), in a
# fraction of the time.
PLAN_XLA_FLAG = "--xla_backend_optimization_level=0"


def plan_env(env: dict) -> dict:
    """``env`` for a memory-plan-only case (``PLAN_XLA_FLAG`` added to XLA_FLAGS)."""
    return {**env, "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} {PLAN_XLA_FLAG}".strip()}


def case_spec(case: Case, options: argparse.Namespace | None = None) -> dict:
    """The JSON case of ``case`` for its worker's ``run_case``; ``options``: this command's
    --dtype, --remat and --prng-impl, which the case's own dtype and remat override (the torch
    layouts take only the case's dtype: no remat, the config's rows and PRNG)."""
    spec = {"model": case.model, "layout": case.layout, "batch_size": case.batch_size,
            "modes": list(case.modes), "iters": case.iters, "max_pairs": case.max_pairs}
    if case.layout in TORCH_LAYOUTS:
        return spec | ({"dtype": case.dtype} if case.dtype else {})
    for key in ("dtype", "remat", "prng_impl"):
        if getattr(options, key, None) is not None:
            spec[key] = getattr(options, key)
    if case.remat is not None:
        spec["remat"] = case.remat
    if case.dtype is not None:
        spec["dtype"] = case.dtype
    if case.batch != "representative":
        spec["batch"] = case.batch
    if case.plan_batch_sizes:
        spec["plan_batch_sizes"] = list(case.plan_batch_sizes)
    return spec


def _case_args(case: Case, options: argparse.Namespace) -> list[str]:
    return ["--case", json.dumps(case_spec(case, options))]


def _curve_args(curve: Curve, options: argparse.Namespace) -> list[str]:
    args = ["--model", curve.model, "--batch-size", str(curve.batch_size), "--layout",
            curve.layout, "--reps", ",".join(map(str, curve.reps)),
            "--max-pairs", str(curve.max_pairs), "--split", curve.split]
    if options.dtype:
        args += ["--dtype", options.dtype]
    if options.prng_impl:
        args += ["--prng-impl", options.prng_impl]
    return args


def measure_peaks(grid: Grid, env: dict, timeout: int) -> dict:
    """The matmul peak of each dtype of the grid, in a fresh process."""
    return {dtype: run_module("benchmarks.flops", ["--size", str(grid.peak_size),
                                                    "--dtype", dtype], timeout, env)
            for dtype in grid.peak_dtypes}


def add_mfu(cases: list[dict], peaks: dict) -> None:
    """Adds ``mfu`` (model FLOP/s over the best measured matmul peak of the case's compute
    dtype) and ``mfu_real_tokens`` to every timed mode of every case."""
    for record in cases:
        if "error" in record:
            continue
        best = peaks.get(record["dtype"]) or peaks.get("float32")
        for mode in ("eval", "train"):
            if mode in record and best:
                timed = record[mode]
                timed["peak_flops_per_s"] = best
                timed["mfu"] = timed["model_flops_per_s"] / best
                timed["mfu_real_tokens"] = timed["model_flops_real_tokens"] / timed["step_s"] / best


def ratios(cases: list[dict]) -> list[dict]:
    """Pairs/s of every other trip-jax layout (``layout``; ``packed_*`` keys: that layout's)
    over the reference layout's, per model, mode and batch size."""
    ok = [c for c in cases if "error" not in c and c["layout"] not in TORCH_LAYOUTS]
    result = []
    for ref in (c for c in ok if c["layout"] == REFERENCE_LAYOUT):
        for packed in (c for c in ok if c["layout"] != REFERENCE_LAYOUT
                       and c["model"] == ref["model"]):
            for mode in ("eval", "train"):
                if mode in ref and mode in packed:
                    result.append({
                        "model": ref["model"], "mode": mode, "layout": packed["layout"],
                        "batch_size": packed["batch_size"], "remat": packed["remat"],
                        "packed_pairs_per_s": packed[mode]["pairs_per_s"],
                        "reference_pairs_per_s": ref[mode]["pairs_per_s"],
                        "ratio": packed[mode]["pairs_per_s"] / ref[mode]["pairs_per_s"]})
    return result


def torch_ratios(cases: list[dict]) -> list[dict]:
    """For every timed mode of every trip-jax case: its pairs/s over the PyTorch reference's
    (``torch_padded`` and ``torch_rows``) of the same model and mode, in the same run. The
    torch case of the same batch size is used when timed, else batch 1 (the reference's)."""
    ok = [c for c in cases if "error" not in c]
    torch_cases = [c for c in ok if c["layout"] in TORCH_LAYOUTS]
    result = []
    for case in (c for c in ok if c["layout"] not in TORCH_LAYOUTS):
        for mode in ("train", "eval"):
            if mode not in case:
                continue
            entry = {"model": case["model"], "layout": case["layout"],
                     "batch_size": case["batch_size"], "remat": case.get("remat", False),
                     "mode": mode, "pairs_per_s": case[mode]["pairs_per_s"]}
            for layout in TORCH_LAYOUTS:
                same = [t for t in torch_cases if t["layout"] == layout
                        and t["model"] == case["model"] and mode in t]
                match = ([t for t in same if t["batch_size"] == case["batch_size"]]
                         or [t for t in same if t["batch_size"] == 1])
                if match:
                    reference = match[0][mode]["pairs_per_s"]
                    entry[f"{layout}_batch_size"] = match[0]["batch_size"]
                    entry[f"{layout}_pairs_per_s"] = reference
                    entry[f"x_{layout}"] = case[mode]["pairs_per_s"] / reference
            if any(f"x_{layout}" in entry for layout in TORCH_LAYOUTS):
                result.append(entry)
    return result


def _target_measures(cases: list[dict], torch: list[dict], layout: str) -> dict:
    """The measured value and bound of every target for one trip-jax layout (None: not
    timed in this run)."""
    def case(batch_size):
        return next((c for c in cases if "error" not in c and c["model"] == TARGETS_MODEL
                     and c["layout"] == layout and c["batch_size"] == batch_size
                     and not c.get("remat")), None)

    def ratio(mode, key):
        entry = next((r for r in torch if r["model"] == TARGETS_MODEL and r["layout"] == layout
                      and r["batch_size"] == 1 and r["mode"] == mode and not r.get("remat")),
                     {})
        return entry.get(key)

    def per_pair(c):
        return c["train"]["step_s"] / c["batch_size"] if c and "train" in c else None

    one, eight = case(1), case(8)
    rss = (eight["memory"].get("rss_peak_after_train_mib") if eight and "train" in eight
           else None)
    return {"train_x_torch_padded": (ratio("train", "x_torch_padded"), None),
            "train_x_torch_rows": (ratio("train", "x_torch_rows"), None),
            "eval_x_torch_padded": (ratio("eval", "x_torch_padded"), None),
            "b8_train_s_per_pair": (per_pair(eight), per_pair(one)),
            "b8_peak_rss_gib": (rss / 1024 if rss else None, None)}


def targets(cases: list[dict], torch: list[dict]) -> list[dict]:
    """Issue #15's MiniLM targets (``TARGETS``) for every trip-jax layout timed on MiniLM
    (the reference layout excepted): measured value, bound, met, and by how much a missed one
    falls short (``missed_by``, a fraction of the bound)."""
    layouts = sorted({c["layout"] for c in cases if "error" not in c
                      and c["model"] == TARGETS_MODEL
                      and c["layout"] not in (*TORCH_LAYOUTS, REFERENCE_LAYOUT)})
    result = []
    for layout in layouts:
        measures = _target_measures(cases, torch, layout)
        for key, what, kind, bound in TARGETS:
            measured, measured_bound = measures[key]
            bound = measured_bound if bound is None else bound
            result.append(judge({"model": TARGETS_MODEL, "layout": layout, "target": key,
                                 "what": what, "kind": kind, "bound": bound,
                                 "measured": measured}))
    return result


def judge(entry: dict) -> dict:
    """``entry`` (kind, bound, measured) with ``met`` (None: not measured) and, when measured,
    ``missed_by``: how far short of the bound, a fraction of it (0 when met; None when a
    bound of 0 is missed)."""
    measured, bound, kind = entry["measured"], entry["bound"], entry["kind"]
    if measured is None or bound is None:
        return {**entry, "met": None}  # not timed in this run
    if kind == "min":
        return {**entry, "met": measured >= bound, "missed_by": max(0.0, 1 - measured / bound)}
    met = measured <= bound if kind == "max" else measured < bound
    missed = measured / bound - 1 if bound else None
    return {**entry, "met": met, "missed_by": 0.0 if met else missed}


def best_peaks(start: dict, end: dict) -> dict:
    """The better of the start and end peak per dtype (the CPU may be shared)."""
    best = {}
    for dtype in start:
        values = [p["peak_flops_per_s"] for p in (start[dtype], end.get(dtype, {}))
                  if "peak_flops_per_s" in p]
        if values:
            best[dtype] = max(values)
    return best


def save(results: dict, out: Path, started: float, derive=None) -> None:
    """Derives MFU, ratios and the summary from what has run so far and writes the JSON
    (after every case, so that a run cut short keeps its finished cases); ``derive(results)``,
    when given, adds more fields after MFU and the ratios, before the summary."""
    peaks = results["matmul_peak"]
    peaks["best_flops_per_s"] = best_peaks(peaks["start"], peaks.get("end", {}))
    add_mfu(results["cases"], peaks["best_flops_per_s"])
    results["ratios"] = ratios(results["cases"])
    results["torch_ratios"] = torch_ratios(results["cases"])
    results["targets"] = targets(results["cases"], results["torch_ratios"])
    results["gpu_memory"] = gpu_memory.estimates(results["cases"],
                                                 results.get("residual_ratios"))
    if derive is not None:
        derive(results)
    results["total_s"] = time.perf_counter() - started
    results["markdown"] = report.markdown(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".tmp")
    partial.write_text(json.dumps(results, indent=1) + "\n")
    partial.replace(out)


def main(argv=None) -> dict:
    """Runs the grid and writes the results JSON (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/cpu.json")
    parser.add_argument("--smoke", action="store_true", help="a seconds-size grid")
    parser.add_argument("--paper", action="store_true",
                        help="the paper configs at their real size (real_size_cpu.json)")
    parser.add_argument("--models", default=None, help="comma-separated subset of the grid")
    parser.add_argument("--batch-sizes", default=None,
                        help="batch sizes to keep (the reference layout is 1)")
    parser.add_argument("--layouts", default=None,
                        help="comma-separated, of: " + ", ".join([*LAYOUTS, *TORCH_LAYOUTS]))
    parser.add_argument("--skip-curves", action="store_true")
    parser.add_argument("--dtype", default=None, help="override model.dtype")
    parser.add_argument("--remat", default=None, action="store_true",
                        help="model.remat = True")
    parser.add_argument("--prng-impl", default=None,
                        help="jax_default_prng_impl (threefry2x32, rbg, unsafe_rbg)")
    parser.add_argument("--compile-cache", default=None,
                        help="persistent jax compilation cache directory for every process")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per process")
    options = parser.parse_args(argv)

    grid = narrow(select_grid(smoke=options.smoke, paper=options.paper),
                  options.models.split(",") if options.models else None,
                  [int(b) for b in options.batch_sizes.split(",")] if options.batch_sizes
                  else None, options.layouts.split(",") if options.layouts else None,
                  options.skip_curves)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if options.compile_cache:
        env["JAX_COMPILATION_CACHE_DIR"] = options.compile_cache
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    started = time.perf_counter()
    out = Path(options.out)
    results = {"command": [sys.argv[0], *(sys.argv[1:] if argv is None else argv)],
               "grid": grid.name, "complete": False, "environment": environment(),
               "load_average": {"start": os.getloadavg()},
               "flops_formula": report.FLOPS_FORMULA,
               "options": {k: v for k, v in vars(options).items() if k != "out"},
               "matmul_peak": {"start": measure_peaks(grid, env, options.timeout)},
               "cases": [], "skipped": [dataclasses.asdict(s) for s in grid.skipped],
               "epoch_curves": []}
    for case in grid.cases:
        label = f"case {case.model} {case.layout} B={case.batch_size} {','.join(case.modes)}"
        results["cases"].append(_run_recorded(
            label, worker(case), _case_args(case, options), "case", case, options,
            env if case.modes else plan_env(env)))
        save(results, out, started)
    for curve in grid.curves:
        label = f"epoch curve {curve.model} {curve.layout} B={curve.batch_size}"
        results["epoch_curves"].append(_run_recorded(
            label, "benchmarks.epoch_time", _curve_args(curve, options), "curve", curve, options,
            env))
        save(results, out, started)
    results["matmul_peak"]["end"] = measure_peaks(grid, env, options.timeout)
    results["load_average"]["end"] = os.getloadavg()
    results["complete"] = True
    save(results, out, started)
    print(results["markdown"])
    print(f"wrote {out} in {results['total_s']:.0f} s", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
