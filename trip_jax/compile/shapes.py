"""The abstract batch of a compiled step: the config's layout at the shapes of TRIP's largest pair.

No data is read: ``batch_spec(config, pairs, shards)`` sizes the layout's arrays from
``LARGEST_PAIR`` (measured on the TRIP splits once, docs/compile.md#batch-shapes), so a compile
that fits fits every batch training builds at that batch size: a bound, not a typical batch.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from trip_jax.data import batch_contract, layouts
from trip_jax.data.features import Buckets

# TRIP's largest pair (the test split's; dev's is smaller), counted with bert-base-uncased's
# WordPiece tokenizer in the sentence-pair encoding (entity, sentence): entities of a story,
# real (story, entity, sentence) rows, tracks with a real row, and tokens over its rows, uncut and
# cut at 16 (exact fidelity), each also with equal rows once (data.dedup_rows).
LARGEST_PAIR = {
    "entities": 27, "rows": 364, "tracks": 52, "longest_row": 39,
    "tokens": {0: 9217, 16: 5824}, "dedup_tokens": {0: 5509, 16: 3520},
}


def _pair_tokens(data_config) -> int:
    """Tokens of the largest pair's encoded rows under ``data.max_length`` and ``dedup_rows``."""
    cut = data_config.max_length
    table = LARGEST_PAIR["dedup_tokens" if data_config.dedup_rows else "tokens"]
    if cut in table:
        return table[cut]
    return min(table[0], LARGEST_PAIR["rows"] * cut)  # every row at most `cut` tokens


def batch_sizes(config, pairs: int, shards: int) -> dict[str, int]:
    """The named sizes (B, E, S and the layout's: N, R, K, P or R, T) of a batch of ``pairs``
    pairs split into ``shards`` equal pieces, each of the largest pair's shapes."""
    data = config.data
    if pairs % shards:
        raise ValueError(f"{pairs} pairs do not split over {shards} devices")
    width = pairs // shards
    longest = min(data.max_length or LARGEST_PAIR["longest_row"], LARGEST_PAIR["longest_row"])
    entities = LARGEST_PAIR["entities"]
    sizes = {"B": pairs, "S": data.max_sentences}
    if data.layout == "packed_tokens":
        rows, tracks = width * LARGEST_PAIR["rows"], width * LARGEST_PAIR["tracks"]
        tokens = width * _pair_tokens(data)
        fit = max(1, data.pack_length - longest + 1)  # first fit fills a sequence this far
        sequences = min(rows, tokens // fit + 1)
        sizes.update(E=entities, N=shards * sequences, R=shards * rows, K=shards * tracks,
                     P=data.pack_length)
    else:
        b = data.buckets
        buckets = Buckets(entity_min=b.entity_min, entity_step=b.entity_step,
                          token_multiple=b.token_multiple)
        if data.entity_padding != "data_max":
            entities = buckets.entities(entities)
        seq_len = data.seq_len or math.ceil(longest / b.token_multiple) * b.token_multiple
        sizes.update(E=entities, R=pairs * 2 * entities * data.max_sentences, T=seq_len)
    return sizes


def batch_spec(config, pairs: int, shards: int) -> dict[str, jax.ShapeDtypeStruct]:
    """``jax.ShapeDtypeStruct`` of every array of the batch (``batch_sizes``), nothing
    allocated; float arrays float32 as the pipeline builds them."""
    dims = {**batch_contract.FIXED_DIMS, **batch_sizes(config, pairs, shards)}
    fields = (*layouts.LAYOUTS[config.data.layout].fields, *batch_contract.PAIR_FIELDS)
    return {f.name: jax.ShapeDtypeStruct(tuple(dims[d] for d in f.dims),
                                         np.float32 if f.dtype == "float" else np.dtype(f.dtype))
            for f in fields}
