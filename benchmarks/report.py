"""Markdown summary of a ``benchmarks.run`` results file (the tables for the README), or a
before/after comparison of several.

    python -m benchmarks.report benchmarks/results/cpu.json
    python -m benchmarks.report before.json after.json
"""

from __future__ import annotations

import json
import sys

FLOPS_FORMULA = (
    "Encoder model FLOPs per step, real rows only, at the batch's padded token length T: "
    "train = 3 x forward, eval = 1 x forward, forward = 2*N*T*rows + 4*L*H*T^2*rows, "
    "N = L*(4*H^2 + 2*H*I) matmul parameters (embeddings, LayerNorm, softmax, heads and "
    "detector not counted). MFU = model FLOP/s / best measured jnp.matmul FLOP/s of the "
    "compute dtype. mfu_real_tokens counts each row at its own length instead of T.")


GPU_MEMORY_FORMULA = (
    "memory(B, d) = state + batch(B) + temp_l2(B, d) + (L - 2) * (temp_l2(B, d) - "
    "temp_l1(B, d)); state = parameters + AdamW state (float32), temp = XLA's temporary "
    "buffers of the train step (activations, gradients, optimizer intermediates) of the 1- "
    "and 2-layer variants on the largest batch at B (benchmarks/gpu_memory.py); bf16 on GPU: "
    "the float32 total less (1 - r) * L * layer, r the bfloat16/float32 ratio of the residual "
    "bytes one encoder layer keeps per token (`residual_ratios`)")


def gpu_memory_rows(entries: list[dict]) -> list[list]:
    """Table rows (GiB) of ``benchmarks.gpu_memory.estimates``."""
    gib = 2 ** 30

    def bf16(e, key):
        return f"{e[key] / gib:.2f}" if key in e else "-"

    return [[e["model"], e["dtype"], e["batch_size"], f"{e['encoder_tokens']:,}",
             f"{e['layer_bytes'] / gib:.2f}", f"{e['state_bytes'] / gib:.1f}",
             f"{e['temp_bytes'] / gib:.1f}", f"{e['total_bytes'] / gib:.1f}",
             f"{e['bytes_per_pair'] / gib:.2f}",
             "-" if e["check_full_over_measured"] is None
             else f"{e['check_full_over_measured']:.2f}",
             bf16(e, "gpu_bfloat16_bytes"), bf16(e, "gpu_bfloat16_bytes_per_pair")]
            for e in entries]


GPU_MEMORY_HEADER = ["model", "dtype", "B", "encoder tokens", "GiB per layer", "state GiB",
                     "activations GiB", "total GiB", "GiB per pair", "check",
                     "bf16 on GPU GiB", "bf16 on GPU GiB per pair"]


def table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return lines


def _num(x: float, digits: int = 3) -> str:
    """A number with ``digits`` significant digits, without exponent for everyday sizes."""
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _model(record: dict) -> str:
    """The model name, with its compute dtype unless float32 and "remat" when on."""
    name = record["model"]
    if record.get("dtype", "float32") != "float32":
        name += f" {record['dtype']}"
    # Records made before issue 25 may have used the retired short-row group.
    name += f" short{record['short_seq_len']}" if record.get("short_seq_len") else ""
    return name + (" remat" if record.get("remat") else "")


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _sys_share(timed: dict) -> str:
    """System CPU time over all CPU time of a timed step."""
    cpu = timed["cpu_user_s_per_step"] + timed["cpu_sys_s_per_step"]
    return f"{100 * timed['cpu_sys_s_per_step'] / max(cpu, 1e-9):.0f}%"


def throughput_rows(cases: list[dict], torch_ratios: list[dict] | None = None) -> list[list]:
    """One row per timed (case, mode); the last two columns are the case's pairs/s over the
    PyTorch reference's (``torch_ratios`` of ``benchmarks.run``; "-" where none)."""
    by_case = {(r["model"], r["layout"], r["batch_size"], bool(r.get("remat")), r["mode"]): r
               for r in torch_ratios or []}
    rows = []
    for c in cases:
        if "error" in c:
            spec = c.get("case", {})
            rows.append([spec.get("model"), spec.get("layout"), spec.get("batch_size"), "-",
                         f"error: {c['error']}"] + [""] * 11)
            continue
        b = c["batch"]
        for mode in ("train", "eval"):
            if mode not in c:
                continue
            t = c[mode]
            rss = c["memory"].get(f"rss_peak_after_{mode}_mib")
            dev = c["memory"].get(f"device_peak_after_{mode}_bytes")
            memory = f"{rss / 1024:.2f}" + (f" / {dev / 2**30:.2f}" if dev else "")
            efficiency = b.get("packing_efficiency",
                               b["real_tokens"] / max(b["encoder_tokens"], 1))
            ratio = by_case.get((c["model"], c["layout"], c["batch_size"],
                                 bool(c.get("remat")), mode), {})
            rows.append([_model(c), c["layout"], c["batch_size"], mode,
                         f"{b['real_rows']}/{b['encoder_rows']}x{b['seq_len']}",
                         f"{100 * efficiency:.0f}%",
                         _num(t["step_s"]), _num(t["pairs_per_s"]), _num(t["real_rows_per_s"]),
                         _num(t["tokens_per_s"]),
                         _num(t["compile_s"]) if "compile_s" in t else "-",
                         f"{100 * t['mfu']:.1f}%" if "mfu" in t else "-",
                         _sys_share(t),
                         memory, _ratio(ratio.get("x_torch_padded")),
                         _ratio(ratio.get("x_torch_rows"))])
    return rows


def target_rows(targets: list[dict]) -> list[list]:
    """One row per (layout, target) of ``benchmarks.run.targets``: measured, bound, status."""
    def value(x, key):
        if x is None:
            return "-"
        if key.startswith(("train_x", "eval_x")):
            return f"{x:.2f}x"
        if key.endswith("_mfu_best"):
            return f"{100 * x:.0f}%"
        return f"{_num(x)} s" if key == "b8_train_s_per_pair" else f"{x:.2f}"

    rows = []
    for t in targets:
        op = {"min": ">=", "max": "<=", "below": "<"}[t["kind"]]
        if t["met"] is None:
            status = "not timed"
        elif t["met"]:
            status = "met"
        elif t["missed_by"] is None:
            status = "missed"
        else:
            status = f"missed by {100 * t['missed_by']:.0f}%"
        rows.append([t["model"], t["layout"], t["what"], value(t["measured"], t["target"]),
                     f"{op} {value(t['bound'], t['target'])}", status])
    return rows


def _paper_lines(results: dict) -> list[str]:
    """The tables of a ``--paper`` run: the full-size cases, the memory plans of the reduced
    ones, and the device memory estimate (``benchmarks.gpu_memory``)."""
    gib = 2 ** 30
    full, plans = [], []
    for c in results["cases"]:
        if "error" in c or c.get("layout") != "config":
            continue
        if "train" in c:
            b, s = c["batch"], c["state"]
            full.append([c["model"], c["tokenizer"].rsplit("/", 2)[-2] if "/" in c["tokenizer"]
                         else c["tokenizer"], f"{s['params'] / 1e6:.0f}M",
                         "x".join(map(str, b["grid_shape"])), b["real_rows"],
                         f"{b['encoder_rows']} in {b.get('sequences', '-')}x{b['seq_len']}",
                         b["real_tokens"], _num(c["eval"]["step_s"]), _num(c["train"]["step_s"]),
                         _num(c["train"]["compile_s"]),
                         f"{c['memory']['rss_peak_after_train_mib'] / 1024:.2f}",
                         f"{c['train']['temp_bytes'] / gib:.2f}"])
        for p in c.get("memory_plans", []):
            plans.append([c["model"], c["dtype"], p["batch_size"], p["batch"]["pairs"],
                          f"{p['batch']['encoder_tokens']:,}", p["batch"]["grid_slots"],
                          f"{p['train']['argument_bytes'] / gib:.2f}",
                          f"{p['train']['temp_bytes'] / gib:.2f}"])
    lines = []
    if full:
        lines += ["", "The paper configs at their real size (exact fidelity, random weights, "
                  "stand-in tokenizer), one train and one eval step on the largest batch of "
                  "the dev pairs at batch 1 (E padded to the data's maximum):", ""]
        lines += table(["model", "tokenizer", "params", "grid B x 2 x E x S", "real rows",
                         "encoder rows in N x P", "real tokens", "eval step s",
                         "train step s", "train compile s", "peak RSS GiB",
                         "XLA train temp GiB"], full)
    if plans:
        lines += ["", "XLA memory plans of the train step (compiled, not run) on the largest "
                  "batch at B:", ""]
        lines += table(["model", "dtype", "B", "pairs", "encoder tokens", "grid cells",
                         "arguments GiB", "temp GiB"], plans)
    if results.get("gpu_memory"):
        lines += ["", f"Device memory of the train step, estimated: {GPU_MEMORY_FORMULA}; "
                  "check: the formula at full depth over the full-size plan (batch 1).", ""]
        lines += table(GPU_MEMORY_HEADER, gpu_memory_rows(results["gpu_memory"]))
    return lines


def _gpu_check_lines(results: dict) -> list[str]:
    """The goals and the parity tests of a ``benchmarks.gpu_check`` run (none otherwise)."""
    lines = []
    if results.get("goals"):
        lines += ["", "Goals (issue #42; this device, same run; torch = the eager PyTorch "
                  "reference's best train pairs/s):", ""]
        lines += table(["model", "layout", "goal", "measured", "required", "status"],
                        target_rows(results["goals"]))
    parity = results.get("parity_tests")
    if parity:
        if "not_run" in parity:
            lines += ["", f"Parity tests: not run ({parity['not_run']})."]
        else:
            lines += ["", f"Parity tests ({' '.join(parity['files'])}): {parity['passed']} "
                      f"passed, {parity['failed']} failed, {parity['errors']} errors, "
                      f"{parity['skipped']} skipped in {parity['wall_s']:.0f} s"
                      + (f"; failed: {', '.join(parity['failed_names'])}"
                         if parity["failed_names"] else "")
                      + (f"; not run: {', '.join(parity['deselected'])}"
                         if parity.get("deselected") else "") + "."]
    return lines


def markdown(results: dict) -> str:
    """The summary tables of one results dict."""
    env = results["environment"]
    peaks = results["matmul_peak"]["best_flops_per_s"]
    first = next(iter(results["matmul_peak"]["start"].values()), {})
    lines = [f"Grid `{results['grid']}` on {first.get('device_kind', '?')} "
             f"({first.get('backend', '?')}, {env['cpu_count']} CPUs, jax {env['jax']}); "
             f"load average {results['load_average']['start'][0]:.1f} at the start, "
             f"{results['load_average'].get('end', [float('nan')])[0]:.1f} at the end; "
             "matmul peak " + ", ".join(f"{d} {p / 1e9:.1f} GFLOP/s" for d, p in peaks.items())
             + f"; total {results.get('total_s', 0):.0f} s"
             + ("." if results.get("complete", True) else " (incomplete: still running or cut "
                "short)."), ""]
    lines += table(["model", "layout", "B", "mode", "real rows / R x T", "real tokens",
                     "step s", "pairs/s", "real rows/s", "tokens/s", "compile s", "MFU",
                     "sys CPU", "peak RSS GiB", "x torch padded", "x torch rows"],
                    throughput_rows(results["cases"], results.get("torch_ratios")))
    if results.get("ratios"):
        lines += ["", "trip-jax layouts over the reference layout (pairs/s):", ""]
        lines += table(["model", "mode", "layout", "B", "pairs/s", "reference pairs/s",
                         "ratio"],
                        [[r["model"] + (" remat" if r.get("remat") else ""), r["mode"],
                          r.get("layout", "packed"), r["batch_size"],
                          _num(r["packed_pairs_per_s"]), _num(r["reference_pairs_per_s"]),
                          f"{r['ratio']:.2f}x"] for r in results["ratios"]])
    if results.get("targets"):
        lines += ["", "Targets (issue #15; MiniLM, this machine, same run; torch = the eager "
                  "PyTorch reference at batch 1):", ""]
        lines += table(["model", "layout", "target", "measured", "required", "status"],
                        target_rows(results["targets"]))
    summaries = [c for c in results["cases"]
                 if "error" not in c and c["layout"] == "packed_tokens"]
    # Records made before issue 25 also hold the retired "packed" layout's column.
    columns = [k for k in ("packed_tokens", "packed", "dense", "reference_dense")
               if k != "packed" or any(k in c["epoch_layout"] for c in summaries)]
    layout_rows = []
    for c in summaries:
        s = c["epoch_layout"]
        layout_rows.append([c["model"], s["batch_size"]] + [
            f"{100 * s[k]['real_row_fraction']:.0f}% / {100 * s[k]['real_token_fraction']:.0f}%"
            f" / {s[k]['distinct_shapes']}" if k in s else "-" for k in columns])
    if layout_rows:
        lines += ["", "One epoch over the dev pairs: real rows / real tokens / distinct "
                  "batch shapes (one compilation each) per layout (real tokens over encoder "
                  "tokens; above 100% where packed_tokens encodes rows with equal tokens once):",
                  ""]
        names = {"dense": "dense (bucketed E)", "reference_dense": "reference"}
        lines += table(["model", "B", *(names.get(k, k) for k in columns)], layout_rows)
    curve_rows = []
    for curve in results.get("epoch_curves", []):
        if "error" in curve:
            curve_rows.append([curve.get("curve", {}).get("model"), "-", "-",
                               f"error: {curve['error']}"] + [""] * 4)
            continue
        for p in curve["points"]:
            curve_rows.append([curve["model"], curve["layout"], curve["batch_size"],
                               f"{p['repeat']}x", p["pairs"], p["steps"], _num(p["epoch_s"]),
                               _num(p["pairs_per_s"])])
    if curve_rows:
        lines += ["", "Training epochs over the dev pairs (a curve's `split`: dev_train, the 254 "
                  "pairs a dev_train run trains on) repeated 1x/2x/4x (every batch shape "
                  "compiled beforehand):", ""]
        lines += table(["model", "layout", "B", "data", "pairs", "steps", "epoch s",
                         "pairs/s"], curve_rows)
        for curve in results.get("epoch_curves", []):
            if "error" in curve:
                continue
            c = curve["compile"]
            line = (f"\n{curve['model']} {curve['layout']} B={curve['batch_size']}: "
                    f"{c['shapes']} batch shapes compiled in {c['compile_s']:.1f} s "
                    f"({c['shapes_in_first_epoch']} in the 1x epoch, which with them takes "
                    f"{curve['first_epoch_s']:.1f} s)")
            if curve.get("fit"):
                f = curve["fit"]
                line += (f"; warm epochs: {1000 * f['s_per_pair']:.1f} ms per pair "
                         f"{'+' if f['fixed_s'] >= 0 else '-'} {abs(f['fixed_s']):.1f} s")
            lines.append(line + ".")
    lines += _paper_lines(results)
    lines += _gpu_check_lines(results)
    if results.get("skipped"):
        lines += ["", "Not run in this grid:", ""]
        lines += [f"- {s['model']} {s['layout']} B={s['batch_size']} "
                  f"{'/'.join(s['modes'])}: {s['reason']}" for s in results["skipped"]]
    return "\n".join(lines) + "\n"


def comparison(runs: dict[str, dict]) -> str:
    """One row per (run, case, mode) of several results files: a before/after table."""
    rows = []
    for label, results in runs.items():
        options = results.get("options", {})
        changed = ", ".join(f"{k}={v}" for k, v in options.items() if k in (
            "dtype", "remat", "prng_impl", "compile_cache",
            "short_seq_len") and v)  # short_seq_len: records made before issue 25
        for c in results["cases"]:
            if "error" in c:
                continue
            for mode in ("train", "eval"):
                if mode in c:
                    t = c[mode]
                    rows.append([label, changed or "-", _model(c), c["layout"], c["batch_size"],
                                 mode, _num(t["step_s"]), _num(t["pairs_per_s"]),
                                 _num(t["compile_s"]) if "compile_s" in t else "-",
                                 _num(t["xla_flops"] / 1e9) if t.get("xla_flops") else "-",
                                 f"{c['memory'][f'rss_peak_after_{mode}_mib'] / 1024:.2f}",
                                 f"{c['load_average_before'][0]:.1f}"])
    return "\n".join(table(["run", "settings", "model", "layout", "B", "mode", "step s",
                              "pairs/s", "compile s", "XLA GFLOP", "peak RSS GiB", "load"],
                             rows)) + "\n"


def main(argv=None) -> None:
    """Prints the markdown summary of a results file, or compares several."""
    argv = sys.argv[1:] if argv is None else argv
    runs = {}
    for path in argv:
        with open(path) as f:
            runs[path.rsplit("/", 1)[-1].removesuffix(".json")] = json.load(f)
    print(markdown(next(iter(runs.values()))) if len(runs) == 1 else comparison(runs))


if __name__ == "__main__":
    main()
