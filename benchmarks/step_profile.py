"""Where a train step's time goes: the step taken apart into separately jitted pieces.

``python -m benchmarks.step_profile --model M --layout L --batch-size B --out FILE`` times each
piece; ``--equations`` counts the steps' jaxpr equations and ``--compile`` adds their cold compile
seconds (nothing run). Details: benchmarks/README.md#the-code-file-by-file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import optax

import trip_jax
from benchmarks import cases, harness
from trip_jax.runtime import jax_setup
from trip_jax.training import losses


def _median_seconds(fn, args: tuple, iters: int) -> float:
    """Compiles and runs ``fn(*args)`` once, then returns the median of ``iters`` timed runs
    (``harness.time_calls``)."""
    return harness.time_calls(lambda: jax.block_until_ready(fn(*args)), iters)["step_s"]


def profile_step(model: str, layout: str, batch_size: int, *, iters: int = 3,
                 prng_impl: str | None = None) -> dict:
    """Times the pieces of one train step (module docstring); returns seconds and shares."""
    if prng_impl:
        jax_setup.set_prng_impl(prng_impl)
    h = harness.Harness.build(model, overrides=cases.LAYOUTS[layout].overrides)
    local = h.layout_batch(layout, harness.representative_pairs(h.encoded, batch_size))
    batch = h.to_device(local)
    tiered = h.trainer.model
    loss_config = h.config.loss
    params = h.state.params
    rng = jax.random.key(1)

    def loss(p, b, key):
        out = tiered.apply({"params": p}, b, deterministic=False, rngs={"dropout": key})
        return losses.tiered_loss(out, b, loss_config)[0]

    def encoder_loss(encoder_params, b, key):
        rows, _ = tiered.apply({"params": {**params, "encoder": encoder_params}}, b, False,
                               rngs={"dropout": key}, method=type(tiered).row_embeddings)
        return jnp.sum(rows * rows)

    def encoder_forward(b, key):
        return tiered.apply({"params": params}, b, False, rngs={"dropout": key},
                            method=type(tiered).row_embeddings)[0]

    grads = jax.jit(jax.grad(loss))(params, batch, rng)
    opt_state = h.state.opt_state

    def optimizer(g, state, p):
        updates, state = h.trainer.tx.update(g, state, p)
        return optax.apply_updates(p, updates), state

    seconds = {
        "eval_step": _median_seconds(h.eval_step, (params, batch), iters),
        "encoder_forward": _median_seconds(jax.jit(encoder_forward), (batch, rng), iters),
        "encoder_grad": _median_seconds(jax.jit(jax.grad(encoder_loss)),
                                        (params["encoder"], batch, rng), iters),
        "loss_and_grad": _median_seconds(jax.jit(jax.value_and_grad(loss)),
                                         (params, batch, rng), iters),
        "optimizer": _median_seconds(jax.jit(optimizer), (grads, opt_state, params), iters),
    }
    state = h.state

    def train(b):
        nonlocal state
        state, metrics = h.train_step(state, b)
        return metrics

    seconds["train_step"] = _median_seconds(train, (batch,), iters)
    seconds["heads_detector_loss_grad"] = seconds["loss_and_grad"] - seconds["encoder_grad"]
    seconds["rest"] = seconds["train_step"] - seconds["loss_and_grad"] - seconds["optimizer"]
    shares = {k: seconds[k] / seconds["train_step"]
              for k in ("encoder_grad", "heads_detector_loss_grad", "optimizer", "rest")}
    sizes = {k: list(v.shape) for k, v in local.items()}
    parameters = {name: int(sum(x.size for x in jax.tree_util.tree_leaves(tree)))
                  for name, tree in params.items()}
    return {"model": model, "layout": layout, "batch_size": batch_size, "iters": iters,
            "prng_impl": str(jax.config.jax_default_prng_impl), "batch_shapes": sizes,
            "parameters": parameters, "seconds": seconds, "share_of_train_step": shares}


def _abstract_case(model: str, layout: str, batch_size: int, remat: bool | None,
                   dtype: str | None) -> tuple[harness.Harness, dict]:
    """Model ``model`` with only the shapes of its train state (``Harness.build(abstract=True)``)
    and a ``layout`` batch of ``batch_size`` representative pairs (host arrays)."""
    h = harness.Harness.build(model, abstract=True, remat=remat, dtype=dtype,
                              overrides=cases.LAYOUTS[layout].overrides)
    return h, h.layout_batch(layout, harness.representative_pairs(h.encoded, batch_size))


def _counts(h: harness.Harness, layout: str, batch_size: int, local: dict) -> dict:
    """The record of ``equation_counts`` for a built case."""
    state = h.state
    return {"model": h.name, "layout": layout, "batch_size": batch_size,
            "dtype": h.config.model.dtype, "remat": bool(h.config.model.remat),
            "encoder_layers": int(h.hf_config.num_hidden_layers),
            "detector_layers": int(h.config.model.tiered.detector_layers),
            "parameter_arrays": len(jax.tree_util.tree_leaves(state.params)),
            "train_step": harness.jaxpr_equations(h.train_step, state, local),
            "eval_step": harness.jaxpr_equations(h.eval_step, state.params, local)}


def equation_counts(model: str, layout: str, batch_size: int, *,
                    remat: bool | None = None, dtype: str | None = None) -> dict:
    """Jaxpr equations of model ``model``'s train and eval steps on a ``layout`` batch of
    ``batch_size`` representative pairs (module docstring), with the parameter arrays' count;
    ``remat`` overrides ``model.remat``, ``dtype`` ``model.dtype``."""
    h, local = _abstract_case(model, layout, batch_size, remat, dtype)
    return _counts(h, layout, batch_size, local)


def compile_seconds(model: str, layout: str, batch_size: int, *,
                    remat: bool | None = None, dtype: str | None = None) -> dict:
    """``equation_counts``'s record plus, per step (train, then eval), ``{step}_compile_s``:
    ``step.lower(...).compile()`` on the shapes it counts (tracing, lowering and XLA, as
    ``harness.time_compiled``'s ``compile_s``), and ``{step}_lower_s``, its trace and lowering.
    Nothing is run. Compiled before the equations are counted (a trace would fill jax's caches);
    ``persistent_cache`` says whether jax's compilation cache directory was set."""
    h, local = _abstract_case(model, layout, batch_size, remat, dtype)
    steps = {"train": (h.train_step, (h.state, local)),
             "eval": (h.eval_step, (h.state.params, local))}
    seconds = {}
    for name, (step, args) in steps.items():
        start = time.perf_counter()
        lowered = step.lower(*args)
        seconds[f"{name}_lower_s"] = time.perf_counter() - start
        lowered.compile()
        seconds[f"{name}_compile_s"] = time.perf_counter() - start
    cache = bool(jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir)
    return {**_counts(h, layout, batch_size, local), **seconds, "persistent_cache": cache}


def main(argv=None) -> None:
    """Parses flags, profiles, writes JSON (and prints it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--layout", default="packed_tokens", choices=sorted(cases.LAYOUTS))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--prng-impl", default=None)
    parser.add_argument("--remat", action="store_true",
                        help="with --equations or --compile: model.remat on")
    parser.add_argument("--dtype", default=None,
                        help="with --equations or --compile: override model.dtype")
    parser.add_argument("--equations", action="store_true",
                        help="count the steps' jaxpr equations of each --model (comma-separated)")
    parser.add_argument("--compile", action="store_true",
                        help="as --equations, and time compiling both steps (nothing run)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.equations or args.compile:
        if args.compile:  # cold compiles only: nothing read from or written to disk
            jax.config.update("jax_enable_compilation_cache", False)
        measure = compile_seconds if args.compile else equation_counts
        result = {"jax": jax.__version__, "trip_jax": os.path.dirname(trip_jax.__file__),
                  "cases": [measure(m, args.layout, args.batch_size,
                                    remat=True if args.remat else None, dtype=args.dtype)
                            for m in args.model.split(",")]}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        json.dump(result["cases"], sys.stdout, indent=1)
        return
    result = profile_step(args.model, args.layout, args.batch_size, iters=args.iters,
                          prng_impl=args.prng_impl)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    json.dump(result["seconds"], sys.stdout, indent=1)


if __name__ == "__main__":
    main()
