"""The train step with the encoder's layer scan rolled and unrolled (``model.unroll_encoder``).

``python -m benchmarks.unroll_encoder --model minilm --rounds 20 --out FILE`` builds both in one
process, then times them alternately (one step each a round): compile seconds, median step seconds
and their ratio. Details: benchmarks/README.md#unrolled-encoder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax

from benchmarks import cases, harness
from trip_jax.runtime import jax_setup

VARIANTS = {"rolled": False, "unrolled": True}


def measure(model: str, layout: str, batch_size: int, rounds: int) -> dict:
    """Both variants of ``model``'s train step at ``layout`` / ``batch_size`` (module docstring)."""
    built = {}
    for name, unroll in VARIANTS.items():
        h = harness.Harness.build(model, overrides={**cases.LAYOUTS[layout].overrides,
                                                    "model.unroll_encoder": unroll})
        batch = jax.block_until_ready(h.to_device(h.layout_batch(
            layout, harness.representative_pairs(h.encoded, batch_size))))
        start = time.perf_counter()
        h.train_step.lower(h.state, batch).compile()
        built[name] = {"h": h, "batch": batch, "compile_s": time.perf_counter() - start,
                       "step_s_all": []}
        for _ in range(2):  # the first call and one more, untimed
            h.state, metrics = h.train_step(h.state, batch)
            jax.block_until_ready(metrics)
    for _ in range(rounds):
        for record in built.values():
            h = record["h"]
            start = time.perf_counter()
            h.state, metrics = h.train_step(h.state, record["batch"])
            jax.block_until_ready(metrics)
            record["step_s_all"].append(time.perf_counter() - start)
    result = {"model": model, "layout": layout, "batch_size": batch_size, "rounds": rounds,
              "prng_impl": str(jax.config.jax_default_prng_impl),
              "load_average_after": os.getloadavg()}
    for name, record in built.items():
        result[name] = {"compile_s": record["compile_s"],
                        "step_s": statistics.median(record["step_s_all"]),
                        "step_s_all": record["step_s_all"]}
    result["rolled_over_unrolled"] = result["rolled"]["step_s"] / result["unrolled"]["step_s"]
    return result


def main(argv=None) -> dict:
    """Command line (module docstring); writes the JSON to ``--out`` and returns it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--layout", default="packed_tokens", choices=sorted(cases.LAYOUTS))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--prng-impl", default="rbg", help="configs/minilm.py's")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    jax_setup.set_prng_impl(args.prng_impl)
    result = measure(args.model, args.layout, args.batch_size, args.rounds)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"{args.model}: rolled {result['rolled']['step_s']:.3f} s, unrolled "
          f"{result['unrolled']['step_s']:.3f} s a step ({result['rolled_over_unrolled']:.2f}x); "
          f"compile {result['rolled']['compile_s']:.1f} s vs "
          f"{result['unrolled']['compile_s']:.1f} s")
    return result


if __name__ == "__main__":
    main()
