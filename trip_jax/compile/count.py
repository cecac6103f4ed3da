"""The model's FLOPs counted from its sizes (no compiler): encoder, heads and detector.

``step_flops(config, hf_config, step, batch_sizes)`` -> FLOPs of one compiled step over the
whole batch (train = 3 x forward), for XLA:GPU's compile-only route (no cost analysis) and beside
XLA:TPU's; benchmarks/flops.py uses the same formulas (benchmarks/README.md#the-code-file-by-file)."""

from __future__ import annotations

import numpy as np

from trip_jax import encoder_registry
from trip_jax.data import schema
from trip_jax.models.tiered import TieredConfig


def encoder_matmul_params(hf_config) -> int:
    """N: parameters that take part in matmuls per token (embeddings excluded): attention's four
    h x h projections and the feed-forward's two h x i matrices, three where its family says it is gated
    (``Family.gated``; a config without ``intermediate_size`` names i ``d_ff``)."""
    h = hf_config.hidden_size
    i = getattr(hf_config, "intermediate_size", None) or hf_config.d_ff
    gated = encoder_registry.family_of(hf_config.model_type).gated(hf_config)
    return hf_config.num_hidden_layers * (4 * h * h + (3 if gated else 2) * h * i)


def encoder_forward_flops(hf_config, lengths: np.ndarray) -> float:
    """Forward FLOPs of the encoder over rows of the given token ``lengths``."""
    lengths = np.asarray(lengths, dtype=np.float64)
    n = encoder_matmul_params(hf_config)
    attention = hf_config.num_hidden_layers * 4 * hf_config.hidden_size * (lengths ** 2).sum()
    return float(2 * n * lengths.sum() + attention)


def heads_detector_forward_flops(hidden: int, tiered: TieredConfig, slots: int,
                                 max_sentences: int) -> float:
    """Forward FLOPs of the state heads, the projections and the conflict detector over
    ``slots`` (story, entity, sentence) rows of stories of ``max_sentences`` (S) slots."""
    a, c, s = schema.NUM_ATTRIBUTES, schema.MAX_CLASSES, max_sentences
    d, f = tiered.detector_d_model, tiered.detector_ff
    heads = 2 * a * 2 * (hidden * hidden + hidden * c)
    projections = 2 * (hidden * tiered.embedding_projection
                       + 2 * sum(schema.NUM_CLASSES) * tiered.state_projection)
    # Per sentence of a track: the layer's matmuls, attention over the S sentences, Dense(S).
    detector = tiered.detector_layers * (2 * (4 * d * d + 2 * d * f) + 4 * s * d) + 2 * d * s
    return float(slots * (heads + projections + detector))


def step_flops(config, hf_config, step: str, sizes: dict[str, int]) -> float:
    """FLOPs of one ``step`` ("train" or "eval") over the whole batch of ``sizes``
    (``compile.shapes.batch_sizes``): the encoder over every sequence (packed_tokens: N x P
    tokens; dense: R x T), heads and detector over every cell of the grid; train = 3 x
    forward."""
    rows, tokens = (sizes["N"], sizes["P"]) if "P" in sizes else (sizes["R"], sizes["T"])
    encoder = encoder_forward_flops(hf_config, np.full(rows, tokens))
    slots = sizes["B"] * 2 * sizes["E"] * sizes["S"]
    heads = heads_detector_forward_flops(hf_config.hidden_size, config.model.tiered, slots,
                                         sizes["S"])
    return (encoder + heads) * (3 if step == "train" else 1)
