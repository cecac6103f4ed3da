"""Times the real jitted train and eval steps of one (model, layout, batch size) case.

A case runs in its own process (``benchmarks.run`` starts one per case) so that its peak memory
is its own. Steps, in order: build the harness (data, model, state, step functions), build one
fixed batch (host time), copy it to the device (host→device time), then for eval and train:
compile ahead of time (compile time, XLA's FLOP count and memory plan), one first run, and
``iters`` timed runs (steady state = their median). Eval runs before train because the train
step donates (consumes) the state.

Layouts (``harness.LAYOUTS``): ``packed_tokens`` (the training layout, ``batch_size``
representative pairs), ``config`` (the config's own layout) and ``reference_dense`` (the
reference's: one pair padded to the data's largest entity count, 7 sentences and the longest row). The eager PyTorch reference's
cases are ``benchmarks.torch_speed``.

    python -m benchmarks.train_speed --case '{"model": "tiny", "layout": "packed_tokens",
        "batch_size": 2, "iters": 1}' --out /tmp/case.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable

import jax
import numpy as np

from benchmarks import flops, harness
from trip_jax import runtime

MODES: tuple[str, ...] = ("eval", "train")


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_peak_bytes() -> int | None:
    """Peak bytes in use on the first local device, where the backend reports it (GPU/TPU)."""
    stats = jax.local_devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def _cost(compiled) -> dict:
    """XLA's FLOP count and memory plan of a compiled step."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0] if cost else {}
    result = {"xla_flops": float(cost.get("flops", 0.0)) if cost else None}
    memory = compiled.memory_analysis()
    if memory is not None:
        result["temp_bytes"] = int(memory.temp_size_in_bytes)
        result["argument_bytes"] = int(memory.argument_size_in_bytes)
        result["output_bytes"] = int(memory.output_size_in_bytes)
        result["alias_bytes"] = int(memory.alias_size_in_bytes)  # outputs in donated inputs
    return result


def state_sizes(state) -> dict:
    """Parameter count and bytes of the train state's parameters and optimizer state, and
    the parameters of each top-level module (the encoder, the heads, the detector)."""
    def count(tree):
        return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))

    def nbytes(tree):
        return sum(int(x.nbytes) for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "nbytes"))

    return {"params": count(state.params), "param_bytes": nbytes(state.params),
            "opt_state_bytes": nbytes(state.opt_state),
            "params_by_module": {k: count(v) for k, v in state.params.items()}}


def memory_plan(h: harness.Harness, batch_size: int, modes: tuple[str, ...]) -> dict:
    """XLA's memory plan of the train and/or eval step on the largest batch at
    ``batch_size`` (``Harness.largest_batch``), compiled but not run, and the batch's size."""
    local, pairs = h.largest_batch(batch_size)
    batch = h.to_device(local)
    real_lengths = np.concatenate([s.lengths for p in pairs for s in p.stories])
    record = {"batch_size": batch_size, "batch": batch_info(local, real_lengths)}
    steps = {"train": (h.train_step, (h.state, batch)),
             "eval": (h.eval_step, (h.state.params, batch))}
    for mode in modes:
        step, args = steps[mode]
        start = time.perf_counter()
        compiled = step.lower(*args).compile()
        record[mode] = {"compile_s": time.perf_counter() - start, **_cost(compiled)}
    return record


def time_step(lowerable, call: Callable[[], object], iters: int, args: tuple) -> dict:
    """Compile time (ahead of time), first-run time and the median of ``iters`` later runs.

    ``call()`` runs one step and returns what to block on; the ahead-of-time compilation fills
    the jit cache, so ``call`` does not compile again.
    """
    start = time.perf_counter()
    compiled = lowerable.lower(*args).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(call())
    first_run_s = time.perf_counter() - start
    times = []
    usage = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_SELF)
    step_s = statistics.median(times) if times else first_run_s
    runs = max(iters, 1)
    return {"compile_s": compile_s, "first_run_s": first_run_s,
            "first_call_s": compile_s + first_run_s, "step_s": step_s, "step_s_all": times,
            # CPU seconds per step: user (compute threads) and system (kernel time: page
            # faults of new buffers, thread-pool synchronisation).
            "cpu_user_s_per_step": (after.ru_utime - usage.ru_utime) / runs,
            "cpu_sys_s_per_step": (after.ru_stime - usage.ru_stime) / runs,
            **_cost(compiled)}


def batch_info(local: dict[str, np.ndarray], real_lengths: np.ndarray) -> dict:
    """Pairs, real and encoder rows and tokens, and shapes of a host batch.

    ``real_tokens`` counts every real row's tokens (a row-by-row encoder's work);
    ``encoded_real_tokens`` those the encoder runs on (fewer where packed_tokens encodes rows
    of equal tokens once); packing efficiency is the latter over ``encoder_tokens``."""
    groups = flops.row_group_shapes(local)
    packed = "segment_ids" in local  # rows share sequences
    info = {"pairs": int(local["pair_mask"].sum()), "real_rows": int(local["row_mask"].sum()),
            "encoder_rows": (int(local["row_start"].size) if packed
                             else sum(rows for rows, _, _ in groups)),
            "seq_len": int(local["input_ids"].shape[1]),
            "row_groups": [list(g) for g in groups],  # (rows, real rows, T) per group
            "grid_shape": list(local["row_mask"].shape),
            "grid_slots": int(np.prod(local["row_mask"].shape)),
            "real_tokens": int(real_lengths.sum()),
            "encoded_real_tokens": (int((local["segment_ids"] > 0).sum()) if packed
                                    else int(real_lengths.sum())),
            "encoder_tokens": sum(rows * seq_len for rows, _, seq_len in groups)}
    if packed:
        info["sequences"] = int(local["input_ids"].shape[0])
    # Packing efficiency: real tokens over the tokens the encoder runs on.
    info["packing_efficiency"] = info["encoded_real_tokens"] / info["encoder_tokens"]
    return info


def rates(timing: dict, info: dict, flops: dict) -> dict:
    """Throughputs of one timed mode (``timing["step_s"]``, ``batch_info``, the mode's FLOPs),
    merged with the timing and FLOPs."""
    step = timing["step_s"]
    rates = {"pairs_per_s": info["pairs"] / step, "real_rows_per_s": info["real_rows"] / step,
             "tokens_per_s": info["real_tokens"] / step,
             "encoder_rows_per_s": info["encoder_rows"] / step,
             "model_flops_per_s": flops["model_flops"] / step}
    if timing.get("xla_flops"):
        rates["xla_flops_per_s"] = timing["xla_flops"] / step
    return {**timing, **flops, **rates}


def run_case(case: dict) -> dict:
    """Runs one case (keys: model, layout, batch_size, iters, modes, data_dir, max_pairs,
    dtype, remat, prng_impl; batch: "representative" pairs (default) or the
    "largest" batch of an epoch; plan_batch_sizes / plan_modes: XLA memory plans of the
    largest batch at those batch sizes, compiled only); returns its record."""
    if case.get("prng_impl"):
        # Global, so it must be set before the harness creates the init and dropout keys.
        runtime.set_prng_impl(case["prng_impl"])
    layout, batch_size = case["layout"], int(case["batch_size"])
    if layout not in harness.LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of "
                         f"{sorted(harness.LAYOUTS)}")
    spec = harness.LAYOUTS[layout]
    if spec.one_pair and batch_size != 1:
        raise ValueError(f"layout {layout!r} holds one pair a batch (batch_size 1)")
    start = time.perf_counter()
    h = harness.Harness.build(case["model"], data_dir=case.get("data_dir", ""),
                              max_pairs=case.get("max_pairs", 0), dtype=case.get("dtype"),
                              remat=case.get("remat"), overrides=spec.overrides)
    jax.block_until_ready(h.state)
    setup_s = time.perf_counter() - start

    start = time.perf_counter()
    if case.get("batch", "representative") == "largest":
        if spec.batch is not harness.Harness.config_batch:
            raise ValueError(f"batch 'largest' needs a layout of the input pipeline, "
                             f"not {layout!r}")
        local, pairs = h.largest_batch(batch_size)
    else:
        pairs = harness.representative_pairs(h.encoded, batch_size)
        local = spec.batch(h, pairs)
    host_batch_s = time.perf_counter() - start
    start = time.perf_counter()
    batch = jax.block_until_ready(h.to_device(local))
    to_device_s = time.perf_counter() - start

    real_lengths = np.concatenate([s.lengths for p in pairs for s in p.stories])
    info = batch_info(local, real_lengths)
    step_flops = flops.step_flops(h.hf_config, h.tiered, local, real_lengths)
    record = {"case": case, "model": h.name, "layout": layout, "batch_size": batch_size,
              "dtype": h.config.model.dtype, "remat": bool(h.config.model.remat),
              "prng_impl": str(jax.config.jax_default_prng_impl),
              "tokenizer": h.tokenizer_name(),
              "encoder": {k: getattr(h.hf_config, k) for k in (
                  "model_type", "hidden_size", "num_hidden_layers", "intermediate_size")},
              "encoder_matmul_params": flops.encoder_matmul_params(h.hf_config),
              "batch": info, "setup_s": setup_s, "host_batch_s": host_batch_s,
              "to_device_s": to_device_s,
              "epoch_layout": h.layout_summary(1 if spec.one_pair else batch_size),
              "num_entities": h.num_entities, "state": state_sizes(h.state),
              "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "memory": {"rss_after_setup_mib": peak_rss_mib()}}

    # Compiled only, before the timed steps consume the state: memory plans at more batch sizes.
    record["memory_plans"] = [memory_plan(h, int(b), tuple(case.get("plan_modes", ("train",))))
                              for b in case.get("plan_batch_sizes", ())]
    iters = int(case.get("iters", 2))
    state = h.state
    for mode in case.get("modes", MODES):
        if mode == "eval":
            timing = time_step(h.eval_step, lambda: h.eval_step(state.params, batch), iters,
                               (state.params, batch))
        elif mode == "train":
            def train_call():
                nonlocal state
                state, metrics = h.train_step(state, batch)
                return metrics

            timing = time_step(h.train_step, train_call, iters, (state, batch))
        else:
            raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
        record[mode] = rates(timing, info, step_flops[mode])
        record["memory"][f"rss_peak_after_{mode}_mib"] = peak_rss_mib()
        record["memory"][f"device_peak_after_{mode}_bytes"] = device_peak_bytes()
    return record


def main(argv=None) -> None:
    """Runs the case given as JSON and writes its record to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help="JSON object (see run_case)")
    parser.add_argument("--out", required=True, help="JSON file for the record")
    args = parser.parse_args(argv)
    record = run_case(json.loads(args.case))
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: record[k] for k in ("model", "layout", "batch_size")}
                     | {m: {"step_s": record[m]["step_s"], "compile_s": record[m]["compile_s"]}
                        for m in MODES if m in record}), file=sys.stderr)


if __name__ == "__main__":
    main()
