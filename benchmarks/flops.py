"""FLOP counts of the tiered model and the machine's measured matmul peak (for MFU).

Encoder FLOPs per row from its layers, widths and tokens (train = 3 x forward), heads and
detector apart; MFU = model FLOP/s over one large ``jnp.matmul``'s rate timed in the same run.
The formula and what it leaves out: benchmarks/README.md#the-code-file-by-file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from trip_jax.compile.count import (  # noqa: F401 (the formulas, used here and re-exported)
    encoder_forward_flops, encoder_matmul_params, heads_detector_forward_flops)
from trip_jax.models.tiered import TieredConfig


def row_group_shapes(batch: dict[str, np.ndarray]) -> list[tuple[int, int, int]]:
    """[(encoder sequences, real rows, token length)] of a batch: for packed_tokens (packed
    sequences, real rows, P), for dense (rows, real rows, T)."""
    slots = int(np.prod(batch["row_mask"].shape))
    return [(batch["input_ids"].shape[0], int((batch["row_index"] < slots).sum()),
             batch["input_ids"].shape[1])]


def step_flops(hf_config, tiered: TieredConfig, batch: dict[str, np.ndarray],
               real_lengths: np.ndarray) -> dict[str, float]:
    """FLOPs of one step on ``batch`` per mode: forward ×3 for train, ×1 for eval.

    ``real_lengths``: the token length of every real row of the batch. The model FLOPs count
    each real row at its row group's token length.
    """
    groups = row_group_shapes(batch)
    real_rows = int(batch["row_mask"].sum())
    slots = int(np.prod(batch["row_mask"].shape))
    max_sentences = batch["row_mask"].shape[-1]
    packed = "segment_ids" in batch  # rows share sequences
    forward = {
        "model_flops": (encoder_forward_flops(hf_config, real_lengths) if packed else
                        sum(encoder_forward_flops(hf_config, np.full(real, seq_len))
                            for _, real, seq_len in groups)),
        "model_flops_real_tokens": encoder_forward_flops(hf_config, real_lengths),
        "encoder_flops_all_rows": sum(encoder_forward_flops(hf_config, np.full(rows, seq_len))
                                      for rows, _, seq_len in groups),
        "heads_detector_flops_real_rows": heads_detector_forward_flops(
            hf_config.hidden_size, tiered, real_rows, max_sentences),
        "heads_detector_flops_grid": heads_detector_forward_flops(
            hf_config.hidden_size, tiered, slots, max_sentences),
    }
    return {mode: {k: v * factor for k, v in forward.items()}
            for mode, factor in (("train", 3), ("eval", 1))}


def measure_matmul_peak(size: int, dtype: str = "float32", min_seconds: float = 0.3,
                        repeats: int = 5) -> dict:
    """Times a jitted ``size``×``size`` matmul; returns the best and median FLOP/s.

    Each timing runs enough back-to-back matmuls to last ``min_seconds`` (fast devices), and the
    peak is the best of ``repeats`` timings (the CPU may be shared).
    """
    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (size, size), jnp.dtype(dtype))
    b = jax.random.normal(key_b, (size, size), jnp.dtype(dtype))
    matmul = jax.jit(jnp.matmul)
    jax.block_until_ready(matmul(a, b))
    start = time.perf_counter()
    jax.block_until_ready(matmul(a, b))
    calls = max(1, int(min_seconds / max(time.perf_counter() - start, 1e-6)))
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = matmul(a, b)
        jax.block_until_ready(out)
        rates.append(2 * size ** 3 * calls / (time.perf_counter() - start))
    return {"size": size, "dtype": dtype, "calls_per_timing": calls,
            "peak_flops_per_s": max(rates), "median_flops_per_s": statistics.median(rates)}


def measure_on_device(size: int, dtype: str) -> dict:
    """``measure_matmul_peak`` on this process's default device, with the backend and the
    devices it ran on."""
    return {**measure_matmul_peak(size, dtype), "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
            "device_kind": jax.devices()[0].device_kind}


def main(argv=None) -> None:
    """Measures the matmul peak on this process's default device; writes JSON to ``--out``."""
    parser = argparse.ArgumentParser(description="matmul peak FLOP/s")
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    with open(args.out, "w") as f:
        json.dump(measure_on_device(args.size, args.dtype), f, indent=1)


if __name__ == "__main__":
    main()
