"""Checks and repairs of TRIP records, shared by the readers of every format.

Each check takes a value, ``where`` (file and line or pair) and the field name, and returns the
checked value or raises ``TripDataError`` naming all three; ``Report`` collects one file's
repairs and warns once per file (``TripDataWarning``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from trip_jax.data import schema
from trip_jax.data.types import Story, StoryPair, empty_states

NUM_CLASSES = np.asarray(schema.NUM_CLASSES, dtype=np.int64)
SIDES = ("precondition", "effect")


class TripDataError(ValueError):
    """Bad TRIP input; the message names the file, the line or pair, and the field."""


class TripDataWarning(UserWarning):
    """TRIP data that was read but is incomplete (e.g. padded states)."""


@dataclasses.dataclass
class Report:
    """Collects repairs made while reading one file, reported once at the end."""

    path: str
    padded: list[str] = dataclasses.field(default_factory=list)
    overwritten: list[str] = dataclasses.field(default_factory=list)
    off_breakpoint: list[str] = dataclasses.field(default_factory=list)

    def emit(self) -> None:
        """Issues one warning per kind of repair, with counts and a few story ids."""
        def few(ids: list[str]) -> str:
            return ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")

        if self.padded:
            warnings.warn(
                f"{self.path}: {len(self.padded)} stories have states for fewer sentences than "
                "they have; their missing sentences were padded with zero labels "
                f"({few(self.padded)})",
                TripDataWarning, stacklevel=3)
        if self.overwritten:
            warnings.warn(
                f"{self.path}: {len(self.overwritten)} (entity, sentence, attribute) labels were "
                f"given twice with different values; the last one was kept, as the authors' code "
                f"does ({few(self.overwritten)})", TripDataWarning, stacklevel=3)
        if self.off_breakpoint:
            warnings.warn(
                f"{self.path}: {len(self.off_breakpoint)} conflicting sentence pairs do not end "
                "at their story's breakpoint; they are not part of the (evidence, breakpoint) "
                f"conflict the model learns (docs/reference.md, 'Labels') "
                f"({few(self.off_breakpoint)})",
                TripDataWarning, stacklevel=3)


def fail(where: str, field: str, problem: str) -> TripDataError:
    return TripDataError(f"{where}: field {field!r}: {problem}")


def required(record: Any, field: str, where: str) -> Any:
    if not isinstance(record, dict):
        raise fail(where, field, f"expected a JSON object holding it, got {type(record).__name__}")
    if field not in record:
        raise fail(where, field, f"missing (fields present: {sorted(record)})")
    return record[field]


def integer(value: Any, where: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(where, field, f"expected an integer, got {value!r}")
    return value


def flag(value: Any, where: str, field: str) -> bool:
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    raise fail(where, field, f"expected true/false or 1/0, got {value!r}")


def strings(value: Any, where: str, field: str, allow_empty: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(where, field, "expected a list of strings")
    if not value and not allow_empty:
        raise fail(where, field, "is empty")
    return tuple(value)


def check_label_range(states: np.ndarray, entities: tuple[str, ...], where: str,
                       field: str) -> None:
    bad = np.argwhere((states < 0) | (states >= NUM_CLASSES))
    if len(bad):
        e, s, side, a = bad[0]
        n = NUM_CLASSES[a]
        raise fail(where, field,
                    f"entity {entities[e]!r} sentence {s} {SIDES[side]} {schema.ATTRIBUTES[a]}: "
                    f"label {states[e, s, side, a]} out of range 0..{n - 1}")


def dense_states(raw: Any, entities: tuple[str, ...], num_sentences: int, where: str,
                  field: str, story_id: str, report: Report) -> np.ndarray:
    """Parses states laid out [entity][sentence][pre/effect][20] (CGLI and HAR)."""
    if not isinstance(raw, list) or len(raw) != len(entities):
        got = len(raw) if isinstance(raw, list) else type(raw).__name__
        raise fail(where, field, f"{got} entity tracks for {len(entities)} entities")
    states = empty_states(len(entities), num_sentences)
    padded = False
    for e, track in enumerate(raw):
        if track == []:  # an entity annotated in no sentence
            track = np.zeros((0, 2, schema.NUM_ATTRIBUTES), dtype=np.int64)
        try:
            arr = np.asarray(track)
        except ValueError as err:  # ragged nesting
            raise fail(where, field,
                        f"entity {entities[e]!r}: not a [sentence][2][20] array ({err})")
        if arr.ndim != 3 or arr.shape[1:] != (2, schema.NUM_ATTRIBUTES):
            raise fail(where, field, f"entity {entities[e]!r}: expected [sentence][2][20] labels, "
                        f"got shape {arr.shape}")
        if arr.dtype.kind not in "iu":
            raise fail(where, field, f"entity {entities[e]!r}: labels must be integers, "
                        f"got {arr.dtype}")
        if arr.shape[0] > num_sentences:
            raise fail(where, field, f"entity {entities[e]!r}: states for {arr.shape[0]} "
                        f"sentences but the story has {num_sentences} sentences")
        padded |= arr.shape[0] < num_sentences
        checked = np.zeros((num_sentences, 2, schema.NUM_ATTRIBUTES), dtype=np.int64)
        checked[:arr.shape[0]] = arr
        check_label_range(checked[None], (entities[e],), where, field)
        states[e] = checked
    if padded:
        report.padded.append(story_id)
    return states


def make_story(story_id: str, sentences: tuple[str, ...], entities: tuple[str, ...],
                states: np.ndarray, plausible: bool,
                conflict_pairs: tuple[tuple[int, int], ...], where: str,
                conflict_field: str) -> Story:
    """Builds a Story after checking its conflict against its plausibility."""
    if plausible and conflict_pairs:
        raise fail(where, conflict_field,
                    f"a plausible story lists conflicts {list(conflict_pairs)}")
    story = Story(story_id=story_id, sentences=sentences, entities=entities, states=states,
                  plausible=plausible, conflict_pairs=conflict_pairs)
    if not plausible and story.conflict is None:
        raise fail(where, conflict_field,
                    f"an implausible story needs an evidence sentence before its breakpoint, "
                    f"got {list(conflict_pairs)}")
    return story


def sentence_index(value: Any, n: int, where: str, field: str) -> int:
    index = integer(value, where, field)
    if not 0 <= index < n:
        raise fail(where, field, f"sentence index {index} out of range 0..{n - 1}")
    return index


def pair_list(value: Any, n: int, where: str, field: str) -> list[tuple[int, int]]:
    if not isinstance(value, list):
        raise fail(where, field, "expected a list of [i, j] sentence pairs")
    pairs = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise fail(where, field, f"expected [i, j] sentence pairs, got {item!r}")
        i, j = (sentence_index(v, n, where, field) for v in item)
        if i == j:
            raise fail(where, field, f"a sentence cannot conflict with itself: {item!r}")
        pairs.append((i, j))
    return pairs


def breakpoint_conflicts(record: dict, n: int, where: str, story_id: str,
                          report: Report) -> tuple[tuple[int, int], ...]:
    """Conflict pairs of an implausible HAR/release story: every (evidence, breakpoint) pair.

    All ``confl_sents`` are kept (``Story.evidence`` picks the latest before the breakpoint);
    ``confl_pairs`` entries that end elsewhere than the breakpoint are reported, not kept.
    """
    bp = sentence_index(required(record, "breakpoint", where), n, where, "breakpoint")
    sents = required(record, "confl_sents", where)
    if not isinstance(sents, list):
        raise fail(where, "confl_sents", "expected a list of sentence indices")
    evidence = [sentence_index(i, n, where, "confl_sents") for i in sents]
    pairs = {(i, bp) for i in evidence if i != bp}
    for i, j in pair_list(required(record, "confl_pairs", where), n, where, "confl_pairs"):
        if j == bp:
            pairs.add((i, j))
        else:
            report.off_breakpoint.append(f"{story_id} ({i}, {j})")
    return tuple(sorted(pairs))


def pair_from_stories(pair_id: str, stories: list[Story], label: int, where: str,
                       label_field: str) -> StoryPair:
    flags = [s.plausible for s in stories]
    if flags.count(True) != 1:
        raise fail(where, "plausible",
                    f"a pair needs exactly one plausible story, got plausible={flags}")
    if label != flags.index(True):
        raise fail(where, label_field,
                    f"label {label} but story {flags.index(True)} is the plausible one")
    return StoryPair(pair_id=pair_id, stories=(stories[0], stories[1]), label=label)
