"""Where the packed layout still pads, and what two proposed batching changes would save.

Counts over one epoch of the dev pairs (no model run): encoder tokens R·T (what the encoder
computes), grid slots B·2·E·S (what the state heads and the conflict detector compute), and
distinct encoder shapes (compilations), for
- ``packed``: the training layout as ``trip_jax.data.batching`` builds it today;
- ``sorted``: the same, after ``sorted_window_order`` (pairs sorted by size inside windows of
  ``window`` batches, batch order shuffled): the proposed ``data.sort_window`` config value;
- ``split``: rows of at most ``split_tokens`` tokens as a second encoder group, exactly as
  ``data.short_seq_len`` builds it;
- ``sorted+split`` both, and ``real``: the real tokens and rows (no padding at all).

    python -m benchmarks.padding --model minilm --batch-sizes 1,8,32
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import numpy as np

from benchmarks import harness
from trip_jax.data import batching
from trip_jax.data.features import Buckets, EncodedPair


def sorted_window_order(encoded: Sequence[EncodedPair], batch_size: int, window: int, *,
                        seed: int, epoch: int) -> np.ndarray:
    """An epoch order whose consecutive ``batch_size`` slices are batches of similar pairs.

    The epoch's shuffled order is cut into windows of ``window`` batches; inside a window pairs
    are sorted by (entities, longest row, rows) and cut into batches; the full batches of the
    epoch are then shuffled (seeded by seed and epoch), and a last partial batch stays last.
    ``window`` 0 or 1 returns the plain shuffled order (today's behaviour).
    """
    order = batching.epoch_order(len(encoded), shuffle=True, seed=seed, epoch=epoch)
    if window <= 1:
        return order
    span = window * batch_size
    chunks = []
    for start in range(0, len(order), span):
        part = sorted(order[start:start + span], key=lambda i: (
            encoded[i].num_entities, encoded[i].max_length, encoded[i].num_rows))
        chunks += [part[j:j + batch_size] for j in range(0, len(part), batch_size)]
    tail = [chunks.pop()] if len(chunks[-1]) < batch_size else []
    rng = np.random.default_rng([seed, epoch, 1])
    chunks = [chunks[i] for i in rng.permutation(len(chunks))] + tail
    return np.concatenate(chunks).astype(np.int64)


def epoch_padding(encoded: Sequence[EncodedPair], batch_size: int, buckets: Buckets, *,
                  seq_len: int | None, max_sentences: int, window: int, split_tokens: int,
                  seed: int = 0) -> dict:
    """Encoder tokens, grid slots and distinct shapes of one packed epoch (module docstring)."""
    order = sorted_window_order(encoded, batch_size, window, seed=seed, epoch=0)
    ordered = [encoded[i] for i in order]
    plans = batching.plan_batches(ordered, batch_size, buckets=buckets, seq_len=seq_len,
                                  max_sentences=max_sentences)
    slots = sum(len(p.pair_index) * 2 * p.num_entities * max_sentences for p in plans)
    one, split = (batching.layout_stats(ordered, batch_size, buckets=buckets, seq_len=seq_len,
                                        max_sentences=max_sentences, short_seq_len=short)
                  for short in (None, split_tokens))
    return {"encoder_tokens": one["packed_tokens"], "grid_slots": slots,
            "shapes": len(one["packed_shapes"]),
            "split_encoder_tokens": split["packed_tokens"],
            "split_shapes": len(split["packed_shapes"])}


def padding_table(encoded: Sequence[EncodedPair], batch_sizes: Sequence[int], buckets: Buckets,
                  *, seq_len: int | None, max_sentences: int, window: int,
                  split_tokens: int) -> list[dict]:
    """One row per batch size: today's packed epoch, sorted, split, both, and the real counts."""
    real_tokens = sum(int(s.lengths.sum()) for p in encoded for s in p.stories)
    real_rows = sum(p.num_rows for p in encoded)
    rows = []
    for batch_size in batch_sizes:
        args = dict(seq_len=seq_len, max_sentences=max_sentences, split_tokens=split_tokens)
        today = epoch_padding(encoded, batch_size, buckets, window=0, **args)
        ordered = epoch_padding(encoded, batch_size, buckets, window=window, **args)
        rows.append({
            "batch_size": batch_size, "window": window, "split_tokens": split_tokens,
            "real_tokens": real_tokens, "real_rows": real_rows,
            "packed": {"encoder_tokens": today["encoder_tokens"],
                       "grid_slots": today["grid_slots"], "shapes": today["shapes"]},
            "sorted": {"encoder_tokens": ordered["encoder_tokens"],
                       "grid_slots": ordered["grid_slots"], "shapes": ordered["shapes"]},
            "split": {"encoder_tokens": today["split_encoder_tokens"],
                      "grid_slots": today["grid_slots"], "shapes": today["split_shapes"]},
            "sorted+split": {"encoder_tokens": ordered["split_encoder_tokens"],
                             "grid_slots": ordered["grid_slots"],
                             "shapes": ordered["split_shapes"]},
        })
    return rows


def main(argv=None) -> None:
    """Prints the padding table of a model's tokenizer and buckets as markdown and JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--window", type=int, default=16, help="batches per sorting window")
    parser.add_argument("--split-tokens", type=int, default=16)
    parser.add_argument("--out", default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    data = harness.ModelData.load(args.model)  # the dev pairs, tokenized as the config does
    layout = data.layout
    rows = padding_table(data.encoded, [int(b) for b in args.batch_sizes.split(",")],
                         layout.buckets, seq_len=layout.seq_len,
                         max_sentences=layout.max_sentences, window=args.window,
                         split_tokens=args.split_tokens)
    print("| B | layout | encoder tokens | real/encoder tokens | grid slots | real rows/slots "
          "| shapes |\n|---|---|---|---|---|---|---|")
    for row in rows:
        for name in ("packed", "sorted", "split", "sorted+split"):
            v = row[name]
            print(f"| {row['batch_size']} | {name} | {v['encoder_tokens']:,} | "
                  f"{100 * row['real_tokens'] / v['encoder_tokens']:.0f}% | "
                  f"{v['grid_slots']:,} | {100 * row['real_rows'] / v['grid_slots']:.0f}% | "
                  f"{v['shapes']} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
