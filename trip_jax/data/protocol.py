"""Evaluation protocols: which pairs train the model, which select the checkpoint, which score it.

- ``standard``: train on train, select on dev, score on test (the paper's protocol).
- ``dev_train``: for data without a train split (as here): train on dev minus a held-out slice,
  select on that slice, score on test. The slice is a fixed share of dev's *plausible stories*,
  drawn with ``holdout_seed``; every pair built from a held-out plausible story is held out, so no
  story is seen in training and in selection.
- ``auto``: ``standard`` when the data has a train split, else ``dev_train`` (logged).

The resolved protocol name goes into every report.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from trip_jax.config.sections import Protocol, choices_of
from trip_jax.data import readers
from trip_jax.data.types import StoryPair

logger = logging.getLogger(__name__)

PROTOCOLS: tuple[str, ...] = choices_of(Protocol)  # data.protocol


@dataclasses.dataclass(frozen=True)
class ProtocolSplits:
    """The pairs of one protocol, and the files they came from (for report hashes)."""

    protocol: str                   # resolved: "standard" or "dev_train"
    train: list[StoryPair]
    selection: list[StoryPair]
    test: list[StoryPair]
    selection_name: str             # "dev" or "dev_holdout"
    files: dict[str, str]           # {split: path} of the files read


def holdout_split(pairs: Sequence[StoryPair], fraction: float, seed: int
                  ) -> tuple[list[StoryPair], list[StoryPair]]:
    """Splits ``pairs`` into (kept, held out), grouping pairs by their plausible story.

    ``round(fraction * groups)`` groups (at least one, at most all but one) are held out, drawn
    by ``np.random.default_rng(seed)``; the order of pairs inside each part is kept.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in (0, 1), got {fraction}")
    groups: dict[tuple[str, ...], int] = {}
    group_of = [groups.setdefault(p.stories[p.label].sentences, len(groups)) for p in pairs]
    if len(groups) < 2:
        raise ValueError(f"dev_train needs at least 2 plausible stories to hold one out; "
                         f"got {len(groups)} from {len(pairs)} pairs")
    n_out = min(max(1, round(fraction * len(groups))), len(groups) - 1)
    held = set(np.random.default_rng(seed).permutation(len(groups))[:n_out].tolist())
    kept = [p for p, g in zip(pairs, group_of) if g not in held]
    out = [p for p, g in zip(pairs, group_of) if g in held]
    return kept, out


def resolve_protocol(protocol: str, available: Sequence[str]) -> str:
    """Returns "standard" or "dev_train" for a configured protocol and the splits found."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {PROTOCOLS}")
    if protocol == "auto":
        if "train" in available:
            return "standard"
        logger.warning("protocol auto: the data has no train split (found: %s), so the model "
                       "trains on dev minus a held-out slice (selection) and is scored on test "
                       "(protocol dev_train)", ", ".join(sorted(available)) or "none")
        return "dev_train"
    return protocol


def load_protocol_splits(data_config) -> ProtocolSplits:
    """Reads the splits the configured protocol needs (``config.data``)."""
    data_dir = readers.default_data_dir(data_config.data_dir)
    files = readers.find_split_files(data_dir)
    protocol = resolve_protocol(data_config.protocol, list(files))
    fmt = data_config.format or None
    limit = data_config.max_pairs or None

    def load(split):
        return readers.load_split(data_dir, split, format=fmt)[:limit]

    test = load("test")
    if protocol == "standard":
        return ProtocolSplits("standard", load("train"), load("dev"), test, "dev",
                              {s: files[s] for s in ("train", "dev", "test")})
    train, selection = holdout_split(load("dev"), data_config.holdout_fraction,
                                     data_config.holdout_seed)
    return ProtocolSplits("dev_train", train, selection, test, "dev_holdout",
                          {s: files[s] for s in ("dev", "test")})
