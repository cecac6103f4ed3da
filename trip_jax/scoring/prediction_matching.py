"""Matching a predictions file's entries to the pairs of a TRIP split, and checking them there.

``match_entries(entries, pairs)`` finds each entry's pair by id in any form or by text;
``check_against_data`` and ``disagreements`` report against the data, as ``Problem`` s.
Details: docs/scoring.md#matching-pairs-and-the-files-own-labels.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from trip_jax.scoring import prediction_formats as formats
from trip_jax.data import schema
from trip_jax.data.types import StoryPair
from trip_jax.scoring.prediction_formats import PairPrediction, Problem


def canonical_id(pair_id: str) -> str:
    """The authors' form of a pair id: the CGLI copy's ``257-C0-257-C0`` becomes ``257-C0``."""
    parts = pair_id.split("-")
    half = len(parts) // 2
    if len(parts) % 2 == 0 and parts[:half] == parts[half:]:
        return "-".join(parts[:half])
    return pair_id


def _text_key(sentences: Sequence[str]) -> tuple[str, ...]:
    return tuple(" ".join(s.split()) for s in sentences)


@dataclasses.dataclass
class PairIndex:
    """Finds a data pair by any form of its id or by its stories' text."""

    pairs: Sequence[StoryPair]

    def __post_init__(self):
        self.by_id: dict[str, set[int]] = collections.defaultdict(set)
        self.by_text: dict[frozenset, set[int]] = collections.defaultdict(set)
        for n, pair in enumerate(self.pairs):
            for name in (pair.pair_id, pair.implausible.story_id):
                self.by_id[name].add(n)
                self.by_id[canonical_id(name)].add(n)
            self.by_text[frozenset(_text_key(s.sentences) for s in pair.stories)].add(n)

    def find_id(self, pair_id: str) -> set[int]:
        """The pairs an id names (exact or canonical form)."""
        return self.by_id.get(pair_id, set()) | self.by_id.get(canonical_id(pair_id), set())

    def find_text(self, stories: Sequence[Sequence[str]]) -> set[int]:
        """The pairs with these two stories, in either order."""
        return self.by_text.get(frozenset(_text_key(s) for s in stories), set())


@dataclasses.dataclass
class Matched:
    """One entry matched to data pair ``n``, story indices in the data's order."""

    entry: PairPrediction
    n: int
    how: str  # "id" or "text"
    swapped: bool
    story_pred: int
    conflict_story: int
    states_story: int


def _orientation(entry: PairPrediction, pair: StoryPair) -> bool | None:
    """False: the file's stories are the data's in order; True: swapped; None: other stories."""
    given = [_text_key(s) for s in entry.stories]
    data = [_text_key(s.sentences) for s in pair.stories]
    if given == data:
        return False
    if given == data[::-1]:
        return True
    return None


def match_entries(entries: Sequence[PairPrediction], pairs: Sequence[StoryPair]
                  ) -> tuple[list[Matched], list[Problem]]:
    """Matches every entry to one data pair (module docstring); returns (matched, problems)."""
    index = PairIndex(pairs)
    matched, problems, seen = [], [], {}
    for entry in entries:
        found, how = set(), "id"
        if entry.pair_id is not None:
            found = index.find_id(entry.pair_id)
        if not found and entry.stories is not None:
            found, how = index.find_text(entry.stories), "text"
        field = "pair_id" if entry.pair_id is not None else "stories"
        if entry.pair_id is None and entry.stories is None:
            problems.append(Problem(entry.where, "pair_id", "missing: the entry gives neither a "
                                    "pair id nor the stories' text"))
            continue
        if not found:
            what = (f"unknown pair id {entry.pair_id!r}" if entry.pair_id is not None else
                    "no pair of the split has these stories")
            if entry.pair_id is not None and entry.stories is not None:
                what += " and no pair of the split has these stories"
            problems.append(Problem(entry.where, field, what))
            continue
        if len(found) > 1:
            ids = sorted(pairs[n].pair_id for n in found)
            problems.append(Problem(entry.where, field, f"matches {len(found)} pairs: {ids}"))
            continue
        n = found.pop()
        swapped = False
        if entry.stories is not None:
            swapped = _orientation(entry, pairs[n])
            if swapped is None:
                problems.append(Problem(entry.where, "stories", f"the stories differ from those "
                                        f"of pair {pairs[n].pair_id!r}, which its id names"))
                continue
        if n in seen:
            problems.append(Problem(entry.where, field, f"duplicate: pair {pairs[n].pair_id!r} "
                                    f"was already given at {seen[n]}"))
            continue
        seen[n] = entry.where
        flip = (lambda k: 1 - k) if swapped else (lambda k: k)
        story_pred = flip(entry.story_pred)
        implausible = 1 - story_pred
        states_story = implausible if entry.states_story is None else flip(entry.states_story)
        conflict_story = (implausible if entry.conflict_story is None
                          else flip(entry.conflict_story))
        matched.append(Matched(entry, n, how, swapped, story_pred, conflict_story, states_story))
    return matched, problems


def check_against_data(matched: Sequence[Matched], pairs: Sequence[StoryPair]) -> list[Problem]:
    """Sentence ranges, entities and repeated states of every matched entry."""
    problems = []
    for m in matched:
        entry, pair = m.entry, pairs[m.n]
        story = pair.stories[m.conflict_story]
        for s in entry.conflict:
            if s >= story.num_sentences:
                problems.append(Problem(entry.where, entry.conflict_field,
                                        f"sentence index {s} out of range: story "
                                        f"{m.conflict_story} has {story.num_sentences} "
                                        "sentences (0-based)"))
        story = pair.stories[m.states_story]
        cells = {}
        for state in entry.states:
            if state.entity not in story.entities:
                problems.append(Problem(entry.where, state.field, f"unknown entity "
                                        f"{state.entity!r} in story {m.states_story} (entities: "
                                        f"{', '.join(story.entities)})"))
                continue
            if state.sentence >= story.num_sentences:
                problems.append(Problem(entry.where, state.field, f"sentence index "
                                        f"{state.sentence} out of range: story {m.states_story} "
                                        f"has {story.num_sentences} sentences (0-based)"))
                continue
            cell = (state.side, state.entity, state.sentence, state.attribute)
            if cells.setdefault(cell, state.label) != state.label:
                problems.append(Problem(entry.where, state.field, f"{state.side} of "
                                        f"{state.attribute} of {state.entity!r} at sentence "
                                        f"{state.sentence} is given twice with different values"))
    return problems


def missing_pairs(matched: Sequence[Matched], pairs: Sequence[StoryPair]) -> list[int]:
    """The indices of the pairs no entry was matched to."""
    given = {m.n for m in matched}
    return [n for n in range(len(pairs)) if n not in given]


def nontrivial_gold(pair: StoryPair, k: int) -> dict[tuple, int]:
    """{(side, entity, sentence, attribute): label} of story k's nontrivial gold states."""
    story, default = pair.stories[k], schema.default_values_array()
    found = {}
    for e, s, side, a in np.argwhere((story.states != 0) & (story.states != default)):
        found[(formats.SIDES[side], story.entities[e], int(s), schema.ATTRIBUTES[a])] = int(
            story.states[e, s, side, a])
    return found


def disagreements(matched: Sequence[Matched], pairs: Sequence[StoryPair],
                  outcomes: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Every gold label and outcome flag the file carries that differs from the data's or this
    scoring's: {"where", "pair_id", "field", "file", "data" (or "scored")}."""
    found = []

    def add(m, field, file_value, key, value):
        found.append({"where": m.entry.where, "pair_id": pairs[m.n].pair_id, "field": field,
                      "file": file_value, key: value})

    for m in matched:
        gold, pair = m.entry.gold, pairs[m.n]
        if "story_label" in gold:
            file_label = 1 - gold["story_label"] if m.swapped else gold["story_label"]
            if file_label != pair.label:
                add(m, "story_label", gold["story_label"], "data", pair.label)
        if "conflict" in gold:
            data_conflict = [int(s) for s in np.flatnonzero(outcomes["gold_sentences"][m.n])]
            if list(gold["conflict"]) != data_conflict:
                add(m, "conflict_label", list(gold["conflict"]), "data", data_conflict)
        if "states" in gold:
            data_states = nontrivial_gold(pair, m.states_story)
            for cell in sorted(set(data_states) | set(gold["states"])):
                if gold["states"].get(cell) != data_states.get(cell):
                    side, entity, sentence, attribute = cell
                    add(m, f"{side}s_label[{entity!r}][{sentence}][{attribute!r}]",
                        gold["states"].get(cell), "data", data_states.get(cell))
        for key, value in m.entry.flags.items():
            scored = bool(outcomes[formats.FLAG_OUTCOMES[key]][m.n])
            if scored != value:
                add(m, key, value, "scored", scored)
    return found
