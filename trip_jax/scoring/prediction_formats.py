"""Reading another system's TRIP predictions: three file formats -> ``PairPrediction`` entries.

``read_predictions(path, format)`` reads ``authors``, ``trip_jax`` or ``minimal`` files and checks
what can be checked without the data, returning the entries and a ``Problem`` list (nothing
dropped without one). The formats: docs/scoring.md#the-formats.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from trip_jax.data import schema

FORMATS: tuple[str, ...] = ("authors", "trip_jax", "minimal")
SIDES: tuple[str, ...] = ("precondition", "effect")
# The per-pair flags a file may carry with its own scoring of the pair: file key -> outcome key.
AUTHORS_FLAGS = {"valid_explanation": "verifiable", "consistent": "consistent"}
TRIP_JAX_FLAGS = {key: key for key in ("correct", "consistent", "verifiable", "conflict_correct")}
FLAG_OUTCOMES = {**AUTHORS_FLAGS, **TRIP_JAX_FLAGS}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One bad piece of input: where (``line 3`` / ``element [2]``), the field, what is wrong."""

    where: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: field {self.field!r}: {self.message}"


@dataclasses.dataclass(frozen=True)
class StatedState:
    """One predicted state: entity name, sentence index, side, attribute and its label."""

    entity: str
    sentence: int
    side: str
    attribute: str
    label: int
    field: str  # where in the entry it was given, for messages


@dataclasses.dataclass
class PairPrediction:
    """One pair's predictions as a file gives them, before matching with the data.

    ``story_pred``, ``states_story`` and every story index follow the file's story order
    (``stories`` when the file gives the texts). ``conflict`` is the set of predicted conflicting
    sentences (any number), given as field ``conflict_field``; ``conflict_story`` and
    ``states_story`` the stories the conflict and the states are placed in (None: the story
    predicted implausible). ``gold`` holds the file's own gold labels (``story_label``,
    ``conflict``, ``states``: {(side, entity, sentence, attribute): label} of nontrivial labels
    of story ``1 - story_label``), ``flags`` its own per-pair outcomes ({file field: bool}, the
    outcome each names in ``FLAG_OUTCOMES``).
    """

    where: str
    pair_id: str | None
    stories: tuple[tuple[str, ...], tuple[str, ...]] | None
    story_pred: int
    conflict: tuple[int, ...]
    states: list[StatedState]
    conflict_field: str = "conflict"
    conflict_story: int | None = None
    states_story: int | None = None
    gold: dict[str, Any] = dataclasses.field(default_factory=dict)
    flags: dict[str, bool] = dataclasses.field(default_factory=dict)


class _Bad(Exception):
    """Raised inside an entry's parser; becomes a ``Problem``."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def _get(record: dict, field: str, required: bool = True) -> Any:
    if field not in record:
        if required:
            raise _Bad(field, f"missing (fields present: {sorted(record)})")
        return None
    return record[field]


def _int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(field, f"expected an integer, got {value!r}")
    return value


def _story_index(value: Any, field: str) -> int:
    if _int(value, field) not in (0, 1):
        raise _Bad(field, f"expected 0 or 1 (the index of a story), got {value!r}")
    return value


def _sentence_list(value: Any, field: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _Bad(field, f"expected a list of sentence indices, got {value!r}")
    out = tuple(_int(v, f"{field}[{x}]") for x, v in enumerate(value))
    for x, v in enumerate(out):
        if v < 0:
            raise _Bad(f"{field}[{x}]", f"sentence index {v} out of range (negative)")
    if len(set(out)) != len(out):
        raise _Bad(field, f"a sentence is listed twice: {list(value)}")
    return tuple(sorted(out))


def _flag(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _Bad(field, f"expected true or false, got {value!r}")
    return value


def _attribute(value: Any, field: str) -> str:
    if value not in schema.ATTRIBUTE_INDEX:
        raise _Bad(field, f"unknown attribute {value!r}; expected one of "
                          f"{', '.join(schema.ATTRIBUTES)}")
    return value


def _side(value: Any, field: str) -> str:
    if value not in SIDES:
        raise _Bad(field, f"unknown side {value!r}; expected 'precondition' or 'effect'")
    return value


def value_label(attribute: str, value: Any, field: str) -> int:
    """The label of a value word (``schema.label_names``, any case) or an integer label."""
    names = schema.label_names(attribute)
    if isinstance(value, str):
        words = [name.lower() for name in names]
        if value.strip().lower() not in words:
            raise _Bad(field, f"unknown value word {value!r} for {attribute}; expected one of "
                              f"{', '.join(repr(n) for n in names)} or a label 0..{len(names) - 1}")
        return words.index(value.strip().lower())
    label = _int(value, field)
    if not 0 <= label < len(names):
        raise _Bad(field, f"label {label} out of range for {attribute} (0..{len(names) - 1})")
    return label


def _entity(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise _Bad(field, f"expected an entity name, got {value!r}")
    return value


def _texts(value: Any, field: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split("\n")
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _Bad(field, "expected a story: a list of sentences or one sentence a line")
    return tuple(value)


def _state_dict(raw: Any, field: str, side: str) -> list[StatedState]:
    """Authors' states: {entity: {sentence as a string: {attribute: label}}}."""
    if not isinstance(raw, dict):
        raise _Bad(field, "expected {entity: {sentence: {attribute: label}}}")
    states = []
    for entity, sentences in raw.items():
        where = f"{field}[{entity!r}]"
        if not isinstance(sentences, dict):
            raise _Bad(where, "expected {sentence: {attribute: label}}")
        for sentence, labels in sentences.items():
            at = f"{where}[{sentence!r}]"
            if not (isinstance(sentence, str) and sentence.isdigit()):
                raise _Bad(at, f"expected a sentence index, got {sentence!r}")
            if not isinstance(labels, dict):
                raise _Bad(at, "expected {attribute: label}")
            for attribute, label in labels.items():
                _attribute(attribute, f"{at}[{attribute!r}]")
                label = value_label(attribute, label, f"{at}[{attribute!r}]")
                states.append(StatedState(entity, int(sentence), side, attribute, label,
                                          f"{at}[{attribute!r}]"))
    return states


def _authors_entry(record: dict, where: str) -> PairPrediction:
    example_id = _get(record, "example_id", required=False)
    stories = None
    if "story0" in record or "story1" in record:
        stories = (_texts(_get(record, "story0"), "story0"), _texts(_get(record, "story1"),
                                                                      "story1"))
    story_label = _story_index(_get(record, "story_label"), "story_label")
    states = (_state_dict(_get(record, "preconditions_pred"), "preconditions_pred",
                          "precondition")
              + _state_dict(_get(record, "effects_pred"), "effects_pred", "effect"))
    gold_states = {}
    for key, side in (("preconditions_label", "precondition"), ("effects_label", "effect")):
        if key in record:
            for s in _state_dict(record[key], key, side):
                gold_states[(side, s.entity, s.sentence, s.attribute)] = s.label
    gold = {"story_label": story_label,
            "conflict": _sentence_list(_get(record, "conflict_label"), "conflict_label")}
    if "preconditions_label" in record or "effects_label" in record:
        gold["states"] = gold_states
    flags = {key: _flag(record[key], key) for key in AUTHORS_FLAGS if key in record}
    return PairPrediction(
        where=where, pair_id=None if example_id is None else str(example_id), stories=stories,
        story_pred=_story_index(_get(record, "story_pred"), "story_pred"),
        conflict=_sentence_list(_get(record, "conflict_pred"), "conflict_pred"),
        states=states, conflict_field="conflict_pred", conflict_story=1 - story_label,
        states_story=1 - story_label, gold=gold, flags=flags)


def _trip_jax_entry(record: dict, where: str) -> PairPrediction:
    story_pred = _story_index(_get(record, "predicted_story"), "predicted_story")
    explanation = _get(record, "explanation")
    if not isinstance(explanation, dict):
        raise _Bad("explanation", "expected an object (explain.explain_pair's)")
    implausible = _story_index(_get(explanation, "implausible_story"),
                               "explanation.implausible_story")
    if implausible != 1 - story_pred:
        raise _Bad("explanation.implausible_story",
                   f"{implausible} is not the story predicted implausible ({1 - story_pred})")
    raw_states = _get(explanation, "states")
    if not isinstance(raw_states, list):
        raise _Bad("explanation.states", "expected a list of states")
    states = []
    for x, raw in enumerate(raw_states):
        field = f"explanation.states[{x}]"
        if not isinstance(raw, dict):
            raise _Bad(field, "expected an object with entity, sentence, side, attribute, label")
        attribute = _attribute(_get(raw, "attribute"), f"{field}.attribute")
        label = value_label(attribute, _get(raw, "label"), f"{field}.label")
        if "value" in raw and value_label(attribute, raw["value"], f"{field}.value") != label:
            raise _Bad(f"{field}.value", f"{raw['value']!r} is not label {label} of {attribute}")
        states.append(StatedState(
            _entity(_get(raw, "entity"), f"{field}.entity"),
            _sentence_list([_get(raw, "sentence")], f"{field}.sentence")[0],
            _side(_get(raw, "side"), f"{field}.side"), attribute, label, field))
    gold = {}
    if "label" in record:
        gold["story_label"] = _story_index(record["label"], "label")
    if "gold_conflict" in record:
        gold["conflict"] = _sentence_list(record["gold_conflict"], "gold_conflict")
    pair_id = _get(record, "pair_id")
    if not isinstance(pair_id, str) or not pair_id:
        raise _Bad("pair_id", f"expected a pair id, got {pair_id!r}")
    return PairPrediction(
        where=where, pair_id=pair_id, stories=None, story_pred=story_pred,
        conflict=_sentence_list(_get(record, "predicted_conflict"), "predicted_conflict"),
        states=states, conflict_field="predicted_conflict", gold=gold,
        flags={key: _flag(record[key], key) for key in TRIP_JAX_FLAGS if key in record})


MINIMAL_FIELDS = ("pair_id", "stories", "plausible_story", "conflict", "states", "states_story")
STATE_FIELDS = ("entity", "sentence", "side", "attribute", "value")


def _minimal_state(raw: Any, field: str) -> StatedState:
    if isinstance(raw, list):
        if len(raw) != len(STATE_FIELDS):
            raise _Bad(field, f"expected [{', '.join(STATE_FIELDS)}], got {raw!r}")
        raw = dict(zip(STATE_FIELDS, raw, strict=True))
        names = {key: f"{field}[{x}]" for x, key in enumerate(STATE_FIELDS)}
    elif isinstance(raw, dict):
        extra = sorted(set(raw) - set(STATE_FIELDS))
        if extra:
            raise _Bad(f"{field}.{extra[0]}", f"unknown field; a state has {STATE_FIELDS}")
        names = {key: f"{field}.{key}" for key in STATE_FIELDS}
    else:
        raise _Bad(field, f"expected [{', '.join(STATE_FIELDS)}] or an object with those keys")

    def get(key):
        if key not in raw:
            raise _Bad(names[key], "missing")
        return raw[key]

    attribute = _attribute(get("attribute"), names["attribute"])
    return StatedState(_entity(get("entity"), names["entity"]),
                       _sentence_list([get("sentence")], names["sentence"])[0],
                       _side(get("side"), names["side"]), attribute,
                       value_label(attribute, get("value"), names["value"]), field)


def _minimal_entry(record: dict, where: str) -> PairPrediction:
    extra = sorted(set(record) - set(MINIMAL_FIELDS))
    if extra:
        raise _Bad(extra[0], f"unknown field; the minimal format has {MINIMAL_FIELDS}")
    pair_id = record.get("pair_id")
    if pair_id is not None and (not isinstance(pair_id, str) or not pair_id):
        raise _Bad("pair_id", f"expected a pair id, got {pair_id!r}")
    stories = None
    if "stories" in record:
        raw = record["stories"]
        if not isinstance(raw, list) or len(raw) != 2:
            raise _Bad("stories", "expected two stories")
        stories = (_texts(raw[0], "stories[0]"), _texts(raw[1], "stories[1]"))
    if pair_id is None and stories is None:
        raise _Bad("pair_id", "missing: give pair_id or stories (to match by the stories' text)")
    raw_states = record.get("states", [])
    if not isinstance(raw_states, list):
        raise _Bad("states", "expected a list of states")
    states_story = record.get("states_story")
    return PairPrediction(
        where=where, pair_id=pair_id, stories=stories,
        story_pred=_story_index(_get(record, "plausible_story"), "plausible_story"),
        conflict=_sentence_list(_get(record, "conflict"), "conflict"),
        states=[_minimal_state(raw, f"states[{x}]") for x, raw in enumerate(raw_states)],
        states_story=None if states_story is None else _story_index(states_story,
                                                                     "states_story"))


_ENTRY_PARSERS = {"authors": _authors_entry, "trip_jax": _trip_jax_entry,
                  "minimal": _minimal_entry}


def _records(text: str, format: str) -> Iterator[tuple[str, Any]]:
    """Yields (where, parsed JSON or a Problem) for every entry of the file."""
    if format == "authors":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            yield "file", Problem("file", "-", f"not valid JSON ({err})")
            return
        if not isinstance(data, list):
            yield "file", Problem("file", "-", "expected a JSON list of pairs (authors format)")
            return
        for x, record in enumerate(data):
            yield f"element [{x}]", record
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", json.loads(line)
        except json.JSONDecodeError as err:
            yield f"line {number}", Problem(f"line {number}", "-", f"not valid JSON ({err.msg})")


def detect_format(text: str) -> str | None:
    """The format of a predictions file's text, from its first readable entry (None when
    unknown)."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        first = data[0] if isinstance(data, list) and data else None
    else:  # JSON Lines: the first line that parses (a malformed one is read and reported later)
        first = None
        for line in filter(str.strip, text.splitlines()):
            try:
                first = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    if not isinstance(first, dict):
        return None
    if "story_pred" in first and "conflict_pred" in first:
        return "authors"
    if "predicted_story" in first:
        return "trip_jax"
    if "plausible_story" in first:
        return "minimal"
    return None


def read_predictions(text: str, format: str) -> tuple[list[PairPrediction], list[Problem]]:
    """Parses a predictions file's text in ``format``; returns (entries, problems)."""
    if format not in _ENTRY_PARSERS:
        raise ValueError(f"unknown predictions format {format!r}; expected one of {FORMATS}")
    entries, problems = [], []
    for where, record in _records(text, format):
        if isinstance(record, Problem):
            problems.append(record)
            continue
        if not isinstance(record, dict):
            problems.append(Problem(where, "-", f"expected a JSON object, got "
                                                f"{type(record).__name__}"))
            continue
        try:
            entries.append(_ENTRY_PARSERS[format](record, where))
        except _Bad as bad:
            problems.append(Problem(where, bad.field, bad.message))
    if not entries and not problems:
        problems.append(Problem("file", "-", "no predictions in the file"))
    return entries, problems
