"""Time per training epoch on the dev pairs, and its growth with 1x, 2x, 4x the pairs.

``python -m benchmarks.epoch_time --model tiny --batch-size 8 --reps 1,2,4 --out FILE`` runs the
training loop's inner steps, compiling every batch shape apart first, and fits seconds per pair
and per epoch. Details: benchmarks/README.md#the-code-file-by-file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from benchmarks import cases, harness
from trip_jax.data import input_pipeline
from trip_jax.runtime import jax_setup
from trip_jax.data import batching


def _stream(h: harness.Harness, encoded, batch_size: int, layout: str, epoch: int):
    """The epoch's host batches in the given layout (``cases.LAYOUTS``; the harness was built
    with its overrides)."""
    if not cases.LAYOUTS[layout].one_pair:
        # As training batches: the config's layout, shuffled by seed and epoch.
        return input_pipeline.batch_stream(encoded, h.layout, batch_size, shuffle=True,
                                           seed=h.config.train.seed, epoch=epoch)
    if batch_size != 1:
        raise ValueError(f"layout {layout!r} holds one pair a batch (batch_size 1)")
    order = batching.epoch_order(len(encoded), shuffle=True, seed=h.config.train.seed,
                                 epoch=epoch)
    return (h.layout_batch(layout, [encoded[i]]) for i in order)


def _shape(local: dict) -> tuple:
    """What a jitted step compiles for: the shape of every batch array."""
    return tuple(sorted((key, value.shape) for key, value in local.items()))


def compile_shapes(h: harness.Harness, state, streams) -> dict[tuple, dict]:
    """Compiles the train step ahead of time for every distinct batch shape of ``streams``
    (iterables of host batches, in epoch order); returns {shape: {"compile_s", "epoch"}}."""
    compiled = {}
    for epoch, stream in enumerate(streams):
        for local in stream:
            shape = _shape(local)
            if shape in compiled:
                continue
            batch = h.to_device(local)
            start = time.perf_counter()
            h.train_step.lower(state, batch).compile()  # also fills the jit cache
            compiled[shape] = {"compile_s": time.perf_counter() - start, "epoch": epoch}
    return compiled


def run_epoch(h: harness.Harness, state, stream, seen) -> tuple[object, dict]:
    """Trains one epoch over the host batches of ``stream``; returns (state, timing).
    ``new_shapes`` counts batches of a shape not in ``seen`` (0 after ``compile_shapes``)."""
    host_s, steps, pairs, new_shapes, pending = 0.0, 0, 0, 0, []
    start = time.perf_counter()
    stream = iter(stream)
    while True:
        tick = time.perf_counter()
        local = next(stream, None)
        if local is None:
            break
        batch = h.to_device(local)
        host_s += time.perf_counter() - tick
        new_shapes += _shape(local) not in seen
        state, metrics = h.train_step(state, batch)
        pending.append(metrics)
        steps += 1
        pairs += int(local["pair_mask"].sum())
    jax.block_until_ready((state, pending))
    epoch_s = time.perf_counter() - start
    return state, {"pairs": pairs, "steps": steps, "epoch_s": epoch_s, "host_s": host_s,
                   "new_shapes": new_shapes, "pairs_per_s": pairs / epoch_s,
                   "load_average_after": os.getloadavg()}


def epoch_curve(model: str, batch_size: int, *, layout: str = "packed_tokens",
                reps: tuple[int, ...] = (1, 2, 4), data_dir: str = "", max_pairs: int = 0,
                dtype: str | None = None, prng_impl: str | None = None,
                split: str = "dev") -> dict:
    """Compiles every shape, then times warm epochs at ``reps`` × the pairs of ``split``."""
    if prng_impl:
        jax_setup.set_prng_impl(prng_impl)
    h = harness.Harness.build(model, data_dir=data_dir, max_pairs=max_pairs, dtype=dtype,
                              overrides=cases.LAYOUTS[layout].overrides, split=split)

    def stream(epoch: int):
        return _stream(h, h.encoded * reps[epoch], batch_size, layout, epoch)

    compiled = compile_shapes(h, h.state, (stream(i) for i in range(len(reps))))
    state, points = h.state, []
    for epoch, rep in enumerate(reps):
        state, timing = run_epoch(h, state, stream(epoch), compiled)
        points.append({"repeat": rep, **timing})
        print(json.dumps(points[-1]), file=sys.stderr, flush=True)
    first_compile_s = sum(c["compile_s"] for c in compiled.values() if c["epoch"] == 0)
    fit = {}
    if len({p["pairs"] for p in points}) > 1:
        slope, intercept = np.polyfit([p["pairs"] for p in points],
                                      [p["epoch_s"] for p in points], 1)
        fit = {"s_per_pair": float(slope), "fixed_s": float(intercept)}
    return {"model": model, "layout": layout, "batch_size": batch_size,
            "dtype": h.config.model.dtype, "prng_impl": str(jax.config.jax_default_prng_impl),
            "split": split, "dev_pairs": len(h.encoded),
            "compile": {"shapes": len(compiled),
                        "shapes_in_first_epoch": sum(c["epoch"] == 0 for c in compiled.values()),
                        "compile_s": sum(c["compile_s"] for c in compiled.values()),
                        "per_shape_s": [c["compile_s"] for c in compiled.values()]},
            "first_epoch_s": first_compile_s + points[0]["epoch_s"],
            "points": points, "fit": fit}


def main(argv=None) -> None:
    """Parses flags, runs the curve, writes JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--layout", default="packed_tokens", choices=sorted(cases.LAYOUTS))
    parser.add_argument("--reps", default="1,2,4")
    parser.add_argument("--max-pairs", type=int, default=0)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--prng-impl", default=None)
    parser.add_argument("--split", default="dev", choices=harness.SPLITS,
                        help="the pairs of an epoch: all dev pairs, or a dev_train run's")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = epoch_curve(args.model, args.batch_size, layout=args.layout,
                         reps=tuple(int(r) for r in args.reps.split(",")),
                         max_pairs=args.max_pairs, dtype=args.dtype, prng_impl=args.prng_impl,
                         split=args.split)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
