"""Device memory of the paper configs' train step at batch B, from XLA's memory plans.

Input: the case records of a ``benchmarks.run --paper`` run; ``FORMULA`` extrapolates the 1- and
2-layer plans to the full depth, and ``check`` tests it against the full model's own plan.
Details: benchmarks/README.md#memory-a-gpu-needs-per-pair.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

def _plans(cases: list[dict], model: str, dtype: str) -> tuple[int, dict[int, dict]]:
    """(state bytes, {batch size: memory plan}) of ``model`` at ``dtype`` (its plan case)."""
    for case in cases:
        if ("error" not in case and case["model"] == model and case["dtype"] == dtype
                and case.get("memory_plans")):
            plans = {p["batch_size"]: p for p in case.get("memory_plans", [])}
            return case["state"]["param_bytes"] + case["state"]["opt_state_bytes"], plans
    return 0, {}


def residual_bytes(hf_config, dtype: str, sequences: int, pack_length: int = 64) -> int:
    """Bytes of what JAX's autodiff keeps for the backward pass of the encoder ``hf_config``
    (compute ``dtype``, dropout on) on ``sequences`` packed sequences of ``pack_length``
    tokens: the leaves of the ``jax.vjp`` closure, traced only (backend-independent)."""
    import jax  # noqa: PLC0415 - the estimate from a results file needs no jax
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from trip_jax.models import builders  # noqa: PLC0415
    from trip_jax.encoder_registry import build_encoder  # noqa: PLC0415

    shape = (sequences, pack_length)
    ids, mask = jnp.full(shape, 5, jnp.int32), jnp.ones(shape, jnp.int32)
    segments = jnp.broadcast_to(jnp.arange(pack_length) // 16 + 1, shape)
    encoder = build_encoder(hf_config, dtype=builders.DTYPES[dtype])
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    params = jax.eval_shape(lambda: encoder.init(
        rngs, ids, mask, None, deterministic=False, segment_ids=segments))["params"]

    def loss(p):
        out = encoder.apply({"params": p}, ids, mask, None, deterministic=False,
                            segment_ids=segments, rngs={"dropout": jax.random.key(2)})
        return out.astype(jnp.float32).sum()

    closure = jax.eval_shape(lambda p: jax.vjp(loss, p)[1], params)
    return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
               for leaf in jax.tree_util.tree_leaves(closure))


def layer_token_residuals(hf_config, dtype: str) -> float:
    """Residual bytes one more encoder layer keeps per token (``residual_bytes`` of 1 and 2
    layers on 8 and 16 sequences: the per-layer weights' share cancels)."""
    def layers(n):
        return type(hf_config).from_dict({**hf_config.to_dict(), "num_hidden_layers": n})

    def per_layer(sequences):
        return (residual_bytes(layers(2), dtype, sequences)
                - residual_bytes(layers(1), dtype, sequences))

    return (per_layer(16) - per_layer(8)) / (8 * 64)


def residual_ratios(encoders: dict[str, object]) -> dict[str, dict]:
    """Per encoder (name: Hugging Face config): the residual bytes per layer-token in
    float32 and bfloat16 and their ratio (what bfloat16 keeps of float32's activations)."""
    result = {}
    for name, hf_config in encoders.items():
        f32 = layer_token_residuals(hf_config, "float32")
        bf16 = layer_token_residuals(hf_config, "bfloat16")
        result[name] = {"float32": f32, "bfloat16": bf16, "ratio": bf16 / f32}
    return result


def estimates(cases: list[dict], ratios: dict[str, dict] | None = None) -> list[dict]:
    """One entry per (full-size model, dtype, batch size) with the plans it needs: its
    tokens, state, activations (temp) and total in bytes, per pair, and the check. With
    ``ratios`` (``residual_ratios``), float32 entries also get ``gpu_bfloat16_bytes``: the
    total with the encoder layers' share, ``L * layer``, scaled by the model's ratio."""
    result = []
    for full in cases:
        if "error" in full or "train" not in full or full.get("layout") != "config":
            continue
        name, layers = full["model"], full["encoder"]["num_hidden_layers"]
        base = re.sub(r"_l\d+$", "", name)
        state = full["state"]["param_bytes"] + full["state"]["opt_state_bytes"]
        for dtype in ("float32", "bfloat16"):
            _, one = _plans(cases, f"{base}_l1", dtype)
            state_two, two = _plans(cases, f"{base}_l2", dtype)
            check = None
            if dtype == full["dtype"] and 1 in one and 1 in two:
                predicted = two[1]["train"]["temp_bytes"] + (layers - 2) * (
                    two[1]["train"]["temp_bytes"] - one[1]["train"]["temp_bytes"])
                check = predicted / full["train"]["temp_bytes"]
            for batch_size, plan in sorted(two.items()):
                if batch_size not in one:
                    continue
                tokens = plan["batch"]["encoder_tokens"]
                layer = plan["train"]["temp_bytes"] - one[batch_size]["train"]["temp_bytes"]
                batch_bytes = plan["train"]["argument_bytes"] - state_two
                temp = plan["train"]["temp_bytes"] + (layers - 2) * layer
                total = state + batch_bytes + temp
                result.append({
                    "model": name, "layers": layers, "dtype": dtype, "batch_size": batch_size,
                    "pairs": plan["batch"]["pairs"], "encoder_tokens": tokens,
                    "grid_cells": plan["batch"]["grid_slots"], "state_bytes": state,
                    "batch_bytes": batch_bytes, "layer_bytes": layer,
                    "temp_bytes": temp, "total_bytes": total,
                    "bytes_per_pair": total / plan["batch"]["pairs"],
                    "check_full_over_measured": check if batch_size == 1 else None})
                ratio = (ratios or {}).get(base, {}).get("ratio")
                if dtype == "float32" and ratio is not None:
                    bf16 = total - (1 - ratio) * layers * layer
                    result[-1].update(gpu_bfloat16_bytes=bf16,
                                      gpu_bfloat16_bytes_per_pair=bf16 / plan["batch"]["pairs"])
    return result


def main(argv=None) -> None:
    """Adds the residual ratios of the paper encoders and the estimates to a results file."""
    from benchmarks import paper_encoders, report  # noqa: PLC0415
    from trip_jax.models import builders  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("results", help="a benchmarks.run --paper results file (rewritten)")
    path = Path(parser.parse_args(argv).results)
    results = json.loads(path.read_text())
    encoders = {name: builders.encoder_config_from_dict(paper_encoders.hf_config_values(name))
                for name in paper_encoders.PAPER_ENCODERS}
    results["residual_ratios"] = residual_ratios(encoders)
    results["gpu_memory"] = estimates(results["cases"], results["residual_ratios"])
    results["markdown"] = report.markdown(results)
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(results["markdown"])


if __name__ == "__main__":
    main()
