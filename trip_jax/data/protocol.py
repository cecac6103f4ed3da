"""Evaluation protocols: which pairs train the model, which select the checkpoint, which score it.

``standard``, ``dev_train``, ``dev_cv``, ``dev_all`` and ``auto`` (``data.protocol``); the
resolved protocol name goes into every report. Details: docs/reference.md#task-and-data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Sequence

import numpy as np

from trip_jax.data import readers
from trip_jax.data.types import StoryPair

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ProtocolSplits:
    """The pairs of one protocol, and the files they came from (for report hashes)."""

    protocol: str                   # resolved: "standard", "dev_train", "dev_cv" or "dev_all"
    train: list[StoryPair]
    selection: list[StoryPair]      # empty under dev_all
    test: list[StoryPair]           # empty under dev_cv
    selection_name: str             # "dev", "dev_holdout", "dev_fold" or "" (dev_all)
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


def _plausible_story(pair: StoryPair) -> tuple[str, ...]:
    """The sentences of a pair's plausible story: the key pairs are grouped by."""
    return tuple(pair.stories[pair.label].sentences)


def cv_folds(pairs: Sequence[StoryPair], folds: int) -> list[int]:
    """The fold (0 .. folds - 1) of every pair, grouped by plausible story and fixed by the data.

    The distinct plausible stories are ordered by the SHA-256 of their sentences joined by
    newlines; the story of rank r and every pair built from it go to fold r % folds. No random
    draw and no file order is involved, so every machine and every pair order gets the same folds.
    """
    digests = {story: hashlib.sha256("\n".join(story).encode("utf-8")).hexdigest()
               for story in map(_plausible_story, pairs)}
    if not 2 <= folds <= len(digests):
        raise ValueError(f"dev_cv: data.folds must be between 2 and the {len(digests)} plausible "
                         f"stories of the {len(pairs)} pairs, got {folds}")
    rank = {story: r for r, story in enumerate(sorted(digests, key=digests.get))}
    return [rank[_plausible_story(p)] % folds for p in pairs]


def cv_split(pairs: Sequence[StoryPair], folds: int, fold: int
             ) -> tuple[list[StoryPair], list[StoryPair]]:
    """(the pairs of every other fold, the pairs of ``fold``) under ``cv_folds``; pair order kept."""
    if not 0 <= fold < folds:
        raise ValueError(f"dev_cv: data.fold must be in 0 .. {folds - 1} (data.folds={folds}), "
                         f"got {fold}")
    of = cv_folds(pairs, folds)
    return ([p for p, f in zip(pairs, of) if f != fold],
            [p for p, f in zip(pairs, of) if f == fold])


def resolve_protocol(protocol: str, available: Sequence[str]) -> str:
    """Returns the protocol to run ("auto" resolved) for a configured one (data.protocol) and
    the splits found."""
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

    test = [] if protocol == "dev_cv" else load("test")
    if protocol == "standard":
        return ProtocolSplits("standard", load("train"), load("dev"), test, "dev",
                              {s: files[s] for s in ("train", "dev", "test")})
    if protocol == "dev_cv":  # test is never read: choices made on CV never see it
        train, selection = cv_split(load("dev"), data_config.folds, data_config.fold)
        return ProtocolSplits("dev_cv", train, selection, [], "dev_fold", {"dev": files["dev"]})
    if protocol == "dev_all":
        return ProtocolSplits("dev_all", load("dev"), [], test, "",
                              {s: files[s] for s in ("dev", "test")})
    train, selection = holdout_split(load("dev"), data_config.holdout_fraction,
                                     data_config.holdout_seed)
    return ProtocolSplits("dev_train", train, selection, test, "dev_holdout",
                          {s: files[s] for s in ("dev", "test")})
