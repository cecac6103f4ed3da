"""The curated marker: which pairs HAR's curated files hold, and the tiers split by it.

A pair is curated when its stories' sentences equal those of a pair of ``MARKER_FILE`` for its
source split; ``marker_split(records, curated)`` gives the tiers of each half, and says so
(``found`` False) when there is no marker file. Details: docs/reference.md#metrics.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trip_jax.data.readers import TripDataError, parsed_once
from trip_jax.data.types import StoryPair

MARKER_FILE = "{split}_curated.har.jsonl"
SUBSETS: tuple[str, ...] = ("curated", "implicit")
TIERS: tuple[str, ...] = ("correct", "consistent", "verifiable")
TIER_NAMES: dict[str, str] = {"correct": "accuracy", "consistent": "consistency",
                              "verifiable": "verifiability"}

PairKey = tuple[tuple[str, ...], tuple[str, ...]]


def source_split(split: str, protocol: str) -> str:
    """The data split a protocol split was read from: "dev_holdout", "dev_fold" and, under the
    dev protocols, "train" come from "dev"; every other split is its own."""
    if split in ("dev_holdout", "dev_fold") or (
            split == "train" and protocol in ("dev_train", "dev_cv", "dev_all")):
        return "dev"
    return split


def marker_path(data_dir: str, split: str) -> str:
    """The marker file of a data split (``MARKER_FILE`` in ``data_dir``)."""
    return os.path.join(data_dir, MARKER_FILE.format(split=split))


def pair_key(pair: StoryPair) -> PairKey:
    """A pair's content key: the sentences of its two stories, in order."""
    return tuple(pair.stories[0].sentences), tuple(pair.stories[1].sentences)


def read_marker(path: str) -> frozenset[PairKey]:
    """The content keys of a marker file's pairs (HAR JSON Lines: ``stories``, two, each with
    ``sentences``), parsed once per content in a process (``readers.parsed_once``). Raises
    TripDataError naming the file and line when one is unreadable."""
    return parsed_once(path, lambda: _parse_marker(path), "marker")


def _parse_marker(path: str) -> frozenset[PairKey]:
    keys = set()
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                stories = json.loads(line)["stories"]
                key = tuple(tuple(str(s) for s in story["sentences"]) for story in stories)
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise TripDataError(f"{path}: line {line_no}: not a HAR pair with two stories' "
                                    f"sentences ({type(err).__name__}: {err})") from None
            if len(key) != 2:
                raise TripDataError(f"{path}: line {line_no}: field 'stories': expected two "
                                    f"stories, got {len(key)}")
            keys.add(key)
    return frozenset(keys)


def curated_ids(pairs: Sequence[StoryPair], data_dir: str, split: str
                ) -> tuple[set[str] | None, str]:
    """(the ids of ``pairs`` that the marker of data split ``split`` holds, the marker's path);
    the ids are None when the marker file is absent."""
    path = marker_path(data_dir, split)
    if not os.path.isfile(path):
        return None, path
    keys = read_marker(path)
    return {p.pair_id for p in pairs if pair_key(p) in keys}, path


def _tiers(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pair count and the three tiers (fractions; None for no pairs), overall and per decoding."""
    n = len(records)

    def share(flags: Iterable[bool]) -> float | None:
        return sum(map(bool, flags)) / n if n else None

    out: dict[str, Any] = {"num_pairs": n}
    out.update({TIER_NAMES[t]: share(r[t] for r in records) for t in TIERS})
    methods = sorted({m for r in records for m in r.get("by_decoding", {})})
    if methods:
        out["by_decoding"] = {m: {TIER_NAMES[t]: share(r["by_decoding"][m][t] for r in records)
                                  for t in TIERS} for m in methods}
    return out


def marker_split(records: Sequence[Mapping[str, Any]], curated: set[str] | None,
                 marker: str) -> dict[str, Any]:
    """The tiers of the curated and the implicit pairs.

    Args:
      records: per-pair records with ``pair_id`` and the ``TIERS`` booleans (the evaluator's;
        ``by_decoding`` too when present).
      curated: the curated pair ids (``curated_ids``), None when the marker was not found.
      marker: the marker file's name or path, reported as given.

    Returns:
      {"marker", "found": False} without a marker; else also "curated" and "implicit", each
      {"num_pairs", "accuracy", "consistency", "verifiability"[, "by_decoding"]}.
    """
    if curated is None:
        return {"marker": marker, "found": False}
    halves = {"curated": [r for r in records if r["pair_id"] in curated],
              "implicit": [r for r in records if r["pair_id"] not in curated]}
    return {"marker": marker, "found": True, **{k: _tiers(v) for k, v in halves.items()}}


def split_pairs_by_marker(pairs: Sequence[StoryPair], records: Sequence[Mapping[str, Any]],
                          data_dir: str, split: str) -> dict[str, Any]:
    """``marker_split`` of ``records`` (of ``pairs``, data split ``split``), the marker read
    from ``data_dir``."""
    ids, path = curated_ids(pairs, data_dir, split)
    return marker_split(records, ids, os.path.basename(path))
