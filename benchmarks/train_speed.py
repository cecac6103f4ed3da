"""Times the real jitted train and eval steps of one (model, layout, batch size) case.

``python -m benchmarks.train_speed --case JSON --out FILE``: one case a process; host, transfer,
compile and steady-state times, XLA's FLOPs and memory plan; ``build`` / ``measure`` serve
``gpu_check``. Details: benchmarks/README.md#the-code-file-by-file.
"""

from __future__ import annotations

import os
import time

import jax

from benchmarks import cases, flops, harness
from trip_jax.runtime import jax_setup


def memory_plan(h: harness.Harness, batch_size: int, modes: tuple[str, ...]) -> dict:
    """XLA's memory plan of the train and/or eval step on the largest batch at
    ``batch_size`` (``Harness.largest_batch``), compiled but not run, and the batch's size."""
    local, pairs = h.largest_batch(batch_size)
    batch = h.to_device(local)
    record = {"batch_size": batch_size,
              "batch": harness.batch_info(local, harness.real_lengths(pairs))}
    steps = {"train": (h.train_step, (h.state, batch)),
             "eval": (h.eval_step, (h.state.params, batch))}
    for mode in modes:
        step, args = steps[mode]
        start = time.perf_counter()
        compiled = step.lower(*args).compile()
        record[mode] = {"compile_s": time.perf_counter() - start, **harness.xla_cost(compiled)}
    return record


def build(case: dict) -> tuple[harness.Harness, float]:
    """The harness of ``case`` (its model, layout overrides, dtype, remat, PRNG, pairs;
    ``run_case`` has the keys) and its setup seconds: one init, which every case of the same
    model, layout, dtype and remat may share (``measure``)."""
    if case.get("prng_impl"):
        # Global, so it must be set before the harness creates the init and dropout keys.
        jax_setup.set_prng_impl(case["prng_impl"])
    layout, batch_size = case["layout"], int(case["batch_size"])
    if layout not in cases.LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {sorted(cases.LAYOUTS)}")
    if cases.LAYOUTS[layout].one_pair and batch_size != 1:
        raise ValueError(f"layout {layout!r} holds one pair a batch (batch_size 1)")
    start = time.perf_counter()
    h = harness.Harness.build(case["model"], data_dir=case.get("data_dir", ""),
                              max_pairs=case.get("max_pairs", 0), dtype=case.get("dtype"),
                              remat=case.get("remat"),
                              overrides=cases.LAYOUTS[layout].overrides)
    jax.block_until_ready(h.state)
    return h, time.perf_counter() - start


def measure(h: harness.Harness, case: dict, setup_s: float) -> dict:
    """Times ``case`` on ``h`` (built by ``build`` for a case of the same model and layout);
    returns its record. The train steps consume ``h.state`` (donated): ``h.state`` is the state
    after them, for the next case."""
    layout, batch_size = case["layout"], int(case["batch_size"])
    spec = cases.LAYOUTS[layout]
    start = time.perf_counter()
    if case.get("batch", "representative") == "largest":
        if spec.batch != "config":
            raise ValueError(f"batch 'largest' needs a layout of the input pipeline, "
                             f"not {layout!r}")
        local, pairs = h.largest_batch(batch_size)
    else:
        pairs = harness.representative_pairs(h.encoded, batch_size)
        local = h.layout_batch(layout, pairs)
    host_batch_s = time.perf_counter() - start
    start = time.perf_counter()
    batch = jax.block_until_ready(h.to_device(local))
    to_device_s = time.perf_counter() - start

    lengths = harness.real_lengths(pairs)
    info = harness.batch_info(local, lengths)
    step_flops = flops.step_flops(h.hf_config, h.tiered, local, lengths)
    record = {"case": case, "model": h.name, "layout": layout, "batch_size": batch_size,
              "dtype": h.config.model.dtype, "remat": bool(h.config.model.remat),
              "prng_impl": str(jax.config.jax_default_prng_impl),
              "tokenizer": h.data.tokenizer_name(),
              "encoder": {k: getattr(h.hf_config, k) for k in (
                  "model_type", "hidden_size", "num_hidden_layers", "intermediate_size")},
              "encoder_matmul_params": flops.encoder_matmul_params(h.hf_config),
              "batch": info, "setup_s": setup_s, "host_batch_s": host_batch_s,
              "to_device_s": to_device_s,
              "epoch_layout": h.layout_summary(1 if spec.one_pair else batch_size),
              "num_entities": h.num_entities, "state": harness.state_sizes(h.state),
              "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "memory": {"rss_after_setup_mib": harness.peak_rss_mib()}}

    # Compiled only, before the timed steps consume the state: memory plans at more batch sizes.
    record["memory_plans"] = [memory_plan(h, int(b), tuple(case.get("plan_modes", ("train",))))
                              for b in case.get("plan_batch_sizes", ())]
    iters = int(case.get("iters", 2))
    for mode in case.get("modes", harness.MODES):
        if mode == "eval":
            timing = harness.time_compiled(
                h.eval_step, lambda: h.eval_step(h.state.params, batch), iters,
                (h.state.params, batch))
        elif mode == "train":
            def train_call():
                h.state, metrics = h.train_step(h.state, batch)
                return metrics

            timing = harness.time_compiled(h.train_step, train_call, iters, (h.state, batch))
        else:
            raise ValueError(f"unknown mode {mode!r}; expected one of {harness.MODES}")
        record[mode] = harness.rates(timing, info, step_flops[mode])
        record["memory"][f"rss_peak_after_{mode}_mib"] = harness.peak_rss_mib()
        record["memory"][f"device_peak_after_{mode}_bytes"] = harness.device_peak_bytes()
    return record


def run_case(case: dict) -> dict:
    """Runs one case (keys: model, layout, batch_size, iters, modes, data_dir, max_pairs,
    dtype, remat, prng_impl; batch: "representative" pairs (default) or the
    "largest" batch of an epoch; plan_batch_sizes / plan_modes: XLA memory plans of the
    largest batch at those batch sizes, compiled only); returns its record."""
    h, setup_s = build(case)
    return measure(h, case, setup_s)


def main(argv=None) -> None:
    """Runs the case given as JSON (``--case``) and writes its record to ``--out``."""
    harness.case_main(run_case, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
