"""Readers: the three TRIP file formats (``cgli``, ``har``, ``release``) -> typed ``StoryPair`` lists.

The format is detected from the file name, else its content, or named by the caller. Bad input
raises ``TripDataError`` naming the file, the line or pair and the field; repairable gaps are
padded and reported in one ``TripDataWarning`` per file. Details: docs/reference.md#task-and-data.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from trip_jax.data import schema
from trip_jax.data.record_checks import (
    breakpoint_conflicts, dense_states, fail, flag, integer, make_story, pair_from_stories,
    pair_list, Report, required, strings, TripDataError)
from trip_jax.data.types import Story, StoryPair, empty_states

T = TypeVar("T")
FORMATS: tuple[str, ...] = ("cgli", "har", "release")
SPLITS: tuple[str, ...] = ("train", "dev", "test")
RELEASE_FILENAME = "www_2s_new.json"
DATA_DIR_ENV = "TRIP_DATA_DIR"
RELEASE_URL = ("https://raw.githubusercontent.com/sled-group/Verifiable-Coherent-NLU/HEAD/"
               "all_data/www_2s_new.json")
GET_DATA_HINT = (
    "Get the authors' release with `python -m trip_jax.datatools download --dest=DIR` (or by hand: "
    f"{RELEASE_URL}, the file all_data/www_2s_new.json of "
    "https://github.com/sled-group/Verifiable-Coherent-NLU) and put it in the data directory, "
    "or provide per-split files named {split}.cgli.jsonl / {split}.har.jsonl.")

# ---------------------------------------------------------------------------------------------
# CGLI: one story a line, two consecutive lines per pair.

def _cgli_story(record: Any, where: str, report: Report) -> Story:
    story_id = required(record, "para_id", where)
    if not isinstance(story_id, str) or not story_id:
        raise fail(where, "para_id", f"expected a non-empty string, got {story_id!r}")
    where = f"{where} ({story_id})"
    sentences = strings(required(record, "sentence_texts", where), where, "sentence_texts")
    entities = strings(required(record, "participants", where), where, "participants",
                        allow_empty=True)
    plausible = flag(required(record, "plausible", where), where, "plausible")
    conflicts = pair_list(required(record, "confl_pairs", where), len(sentences), where,
                           "confl_pairs")
    states = dense_states(required(record, "states", where), entities, len(sentences), where,
                           "states", story_id, report)
    return make_story(story_id, sentences, entities, states, plausible, tuple(conflicts),
                       where, "confl_pairs")


def _read_cgli(path: str, report: Report) -> list[StoryPair]:
    stories: list[tuple[int, Story]] = []
    for line_no, record in _json_lines(path):
        stories.append((line_no, _cgli_story(record, f"{path}: line {line_no}", report)))
    if len(stories) % 2:
        raise TripDataError(f"{path}: line {stories[-1][0]}: an odd number of stories "
                            f"({len(stories)}); CGLI files hold pairs on consecutive lines")
    pairs = []
    for (line_a, a), (line_b, b) in zip(stories[::2], stories[1::2]):
        where = f"{path}: lines {line_a}-{line_b} ({a.story_id}, {b.story_id})"
        plausible = [a.plausible, b.plausible]
        label = plausible.index(True) if plausible.count(True) == 1 else 0
        pair_id = (b if label == 0 else a).story_id  # the implausible story names the pair
        pairs.append(pair_from_stories(pair_id, [a, b], label, where, "plausible"))
    return pairs


# ---------------------------------------------------------------------------------------------
# HAR: one pair a line.

def _har_story(record: Any, pair_id: str, k: int, where: str, report: Report) -> Story:
    sentences = strings(required(record, "sentences", where), where, "sentences")
    entities = strings(required(record, "entities", where), where, "entities", allow_empty=True)
    plausible = flag(required(record, "plausible", where), where, "plausible")
    story_id = f"{pair_id}/{k}"
    if plausible:  # must list no conflict; make_story checks
        conflicts = tuple(pair_list(required(record, "confl_pairs", where), len(sentences), where,
                                     "confl_pairs"))
    else:
        conflicts = breakpoint_conflicts(record, len(sentences), where, story_id, report)
    states = dense_states(required(record, "states", where), entities, len(sentences), where,
                           "states", story_id, report)
    return make_story(story_id, sentences, entities, states, plausible, conflicts, where,
                       "confl_pairs" if plausible else "confl_sents")


def _two_stories(record: Any, where: str) -> list:
    stories = required(record, "stories", where)
    if not isinstance(stories, list) or len(stories) != 2:
        got = len(stories) if isinstance(stories, list) else type(stories).__name__
        raise fail(where, "stories", f"expected two stories, got {got}")
    return stories


def _label(record: Any, field: str, where: str) -> int:
    label = integer(required(record, field, where), where, field)
    if label not in (0, 1):
        raise fail(where, field, f"label {label} out of range 0..1")
    return label


def _read_har(path: str, report: Report) -> list[StoryPair]:
    pairs = []
    for line_no, record in _json_lines(path):
        where = f"{path}: line {line_no}"
        pair_id = required(record, "example_id", where)
        if not isinstance(pair_id, str) or not pair_id:
            raise fail(where, "example_id", f"expected a non-empty string, got {pair_id!r}")
        where = f"{where} ({pair_id})"
        label = _label(record, "pair_plausible_story", where)
        stories = [_har_story(s, pair_id, k, f"{where} story {k}", report)
                   for k, s in enumerate(_two_stories(record, where))]
        pairs.append(pair_from_stories(pair_id, stories, label, where, "pair_plausible_story"))
    return pairs


def _json_lines(path: str):
    """Yields (line number, parsed JSON) for every non-blank line."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as err:
                raise TripDataError(f"{path}: line {line_no}: unreadable JSON: {err}") from None


# ---------------------------------------------------------------------------------------------
# The authors' release: [cloze, order], cloze = {partition: [pair, ...]}.

def _release_states(raw: Any, num_sentences: int, where: str, story_id: str,
                    report: Report) -> tuple[tuple[str, ...], np.ndarray]:
    """Converts per-sentence {attribute: [[entity, raw 0..8], ...]} to entities and states."""
    if not isinstance(raw, list):
        raise fail(where, "states", "expected a list with one object per sentence")
    if len(raw) > num_sentences:
        raise fail(where, "states", f"annotations for {len(raw)} sentences but the story has "
                    f"{num_sentences} sentences")
    if len(raw) < num_sentences:
        report.padded.append(story_id)
    labels: dict[str, dict[tuple[int, int], tuple[int, int]]] = {}  # first-appearance order
    for s, sentence in enumerate(raw):
        field = f"states[{s}]"
        if not isinstance(sentence, dict):
            raise fail(where, field, "expected an object {attribute: [[entity, label], ...]}")
        for attribute, entries in sentence.items():
            if attribute not in schema.ATTRIBUTE_INDEX:
                raise fail(where, field, f"unknown attribute {attribute!r}")
            a = schema.ATTRIBUTE_INDEX[attribute]
            if not isinstance(entries, list):
                raise fail(where, f"{field}.{attribute}", "expected a list of [entity, label]")
            for entry in entries:
                if (not isinstance(entry, list) or len(entry) != 2
                        or not isinstance(entry[0], str)):
                    raise fail(where, f"{field}.{attribute}",
                                f"expected [entity, label], got {entry!r}")
                entity, value = entry[0], integer(entry[1], where, f"{field}.{attribute}")
                try:
                    pre_eff = schema.change_direction_to_pre_effect(attribute, value)
                except ValueError as err:
                    raise fail(where, f"{field}.{attribute}",
                                f"entity {entity!r}: {err}") from None
                track = labels.setdefault(entity, {})
                if track.get((s, a), pre_eff) != pre_eff:
                    report.overwritten.append(f"{story_id} sentence {s} {entity} {attribute}")
                track[(s, a)] = pre_eff
    entities = tuple(labels)
    states = empty_states(len(entities), num_sentences)
    for e, track in enumerate(labels.values()):
        for (s, a), (pre, eff) in track.items():
            states[e, s, 0, a] = pre
            states[e, s, 1, a] = eff
    return entities, states


def _release_pair(record: Any, where: str, report: Report) -> StoryPair:
    pair_id = required(record, "example_id", where)
    if not isinstance(pair_id, str) or not pair_id:
        raise fail(where, "example_id", f"expected a non-empty string, got {pair_id!r}")
    where = f"{where} ({pair_id})"
    label = _label(record, "label", where)
    stories = []
    for k, raw in enumerate(_two_stories(record, where)):
        story_where = f"{where} story {k}"
        sentences = strings(required(raw, "sentences", story_where), story_where, "sentences")
        story_id = raw.get("example_id", f"{pair_id}/{k}")
        if not isinstance(story_id, str) or not story_id:
            raise fail(story_where, "example_id", f"expected a non-empty string, got {story_id!r}")
        # The authors' code takes plausibility and the conflict from the pair's fields.
        plausible = k == label
        if "plausible" in raw and flag(raw["plausible"], story_where, "plausible") != plausible:
            raise fail(story_where, "plausible",
                        f"plausible={raw['plausible']} disagrees with the pair's label {label}")
        conflicts = () if plausible else breakpoint_conflicts(record, len(sentences), where,
                                                               story_id, report)
        entities, states = _release_states(required(raw, "states", story_where), len(sentences),
                                           story_where, story_id, report)
        stories.append(make_story(story_id, sentences, entities, states, plausible, conflicts,
                                   where, "confl_sents"))
    return StoryPair(pair_id=pair_id, stories=(stories[0], stories[1]), label=label)


def _release_cloze(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise TripDataError(f"{path}: unreadable JSON: {err}") from None
    cloze = data[0] if isinstance(data, list) and data else data
    if not isinstance(cloze, dict) or not all(isinstance(v, list) for v in cloze.values()):
        raise TripDataError(f"{path}: expected the release layout [cloze, order] with "
                            "cloze = {partition: [pair, ...]}")
    return cloze


def read_release_partitions(path: str) -> dict[str, list[StoryPair]]:
    """Reads every partition of a release file: ``{partition: [StoryPair, ...]}``."""
    report = Report(path)
    partitions = {}
    for name, records in _release_cloze(path).items():
        partitions[name] = [_release_pair(r, f"{path}: {name} pair {i}", report)
                            for i, r in enumerate(records)]
    report.emit()
    return partitions


def _read_release(path: str, split: str | None, report: Report) -> list[StoryPair]:
    cloze = _release_cloze(path)
    if split is None:
        nonempty = [name for name, records in cloze.items() if records]
        if len(nonempty) != 1:
            counts = {name: len(records) for name, records in cloze.items()}
            raise TripDataError(f"{path}: the release holds several partitions {counts}; "
                                "name one with split=")
        split = nonempty[0]
    if split not in cloze:
        raise TripDataError(f"{path}: no partition {split!r}; the file has {sorted(cloze)}")
    return [_release_pair(r, f"{path}: {split} pair {i}", report)
            for i, r in enumerate(cloze[split])]


# ---------------------------------------------------------------------------------------------
# Public API.

def detect_format(path: str) -> str:
    """Returns the format of a TRIP file ("cgli", "har" or "release") from its name or content."""
    name = os.path.basename(path)
    if name.endswith(".cgli.jsonl"):
        return "cgli"
    if name.endswith(".har.jsonl"):
        return "har"
    with open(path, encoding="utf-8") as f:
        first = f.readline()
        while first and not first.strip():
            first = f.readline()
    if first.lstrip().startswith("["):
        return "release"
    try:
        record = json.loads(first)
    except json.JSONDecodeError as err:
        raise TripDataError(f"{path}: line 1: cannot tell the TRIP format, the first line is not "
                            f"JSON ({err}); name it with format= (one of {FORMATS})") from None
    if isinstance(record, dict) and "para_id" in record:
        return "cgli"
    if isinstance(record, dict) and "pair_plausible_story" in record:
        return "har"
    if isinstance(record, dict) and record and set(record) <= set(SPLITS):
        return "release"
    raise TripDataError(f"{path}: cannot tell the TRIP format from the name or content; "
                        f"name it with format= (one of {FORMATS})")


def read_pairs(path: str, format: str | None = None, split: str | None = None) -> list[StoryPair]:
    """Reads one TRIP file into story pairs.

    Args:
      path: a CGLI / HAR JSON Lines file or the authors' release JSON.
      format: "cgli", "har" or "release"; detected from the file when None.
      split: release only: the partition to read ("train", "dev", "test"); may be omitted when
        the file holds a single non-empty partition.

    Raises:
      TripDataError: bad input (the message names the file, line or pair, and field).
    """
    if not os.path.isfile(path):
        raise TripDataError(f"{path}: no such file. {GET_DATA_HINT}")
    format = format or detect_format(path)
    if format not in FORMATS:
        raise TripDataError(f"{path}: unknown format {format!r}; expected one of {FORMATS}")

    def parse() -> tuple[tuple[StoryPair, ...], Report]:
        report = Report(path)
        if format == "cgli":
            pairs = _read_cgli(path, report)
        elif format == "har":
            pairs = _read_har(path, report)
        else:
            pairs = _read_release(path, split, report)
        for pair in pairs:
            for story in pair.stories:
                story.states.setflags(write=False)  # shared by every later read of the file
        return tuple(pairs), report

    pairs, report = parsed_once(path, parse, format, split)
    report.emit()  # the repairs are reported at every read
    return list(pairs)


# What ``parsed_once`` parsed in this process, by (path, content digest, key).
_PARSED: dict[tuple[Any, ...], Any] = {}


def parsed_once(path: str, parse: Callable[[], T], *key: Any) -> T:
    """``parse()`` of the file at ``path``, run once per content (and ``key``) in a process: a
    file read again (each fold of a cross-validation, each evaluation) gets the first result;
    a rewritten file is parsed anew."""
    with open(path, "rb") as f:
        entry = (path, hashlib.sha256(f.read()).hexdigest(), *key)
    if entry not in _PARSED:
        _PARSED[entry] = parse()
    return _PARSED[entry]


def default_data_dir(data_dir: str | None = None) -> str:
    """Returns ``data_dir`` if given, else ``$TRIP_DATA_DIR``; a clear error when neither is set."""
    if data_dir:
        return data_dir
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return env
    raise TripDataError(f"no TRIP data directory: pass --data_dir or set ${DATA_DIR_ENV}. "
                        f"{GET_DATA_HINT}")


def find_split_files(data_dir: str) -> dict[str, str]:
    """Finds the file for each split in ``data_dir``: ``{split: path}`` for the splits found.

    Per split, ``{split}.cgli.jsonl`` wins over ``{split}.har.jsonl``, which wins over the
    release ``www_2s_new.json`` (which provides all three). Subset files such as
    ``test_curated.har.jsonl`` are never taken for a whole split; read them by path.
    """
    if not os.path.isdir(data_dir):
        raise TripDataError(f"{data_dir}: no such directory. {GET_DATA_HINT}")
    release = os.path.join(data_dir, RELEASE_FILENAME)
    found = {}
    for split in SPLITS:
        for candidate in (f"{split}.cgli.jsonl", f"{split}.har.jsonl"):
            if os.path.isfile(os.path.join(data_dir, candidate)):
                found[split] = os.path.join(data_dir, candidate)
                break
        else:
            if os.path.isfile(release):
                found[split] = release
    return found


def load_split(data_dir: str, split: str, format: str | None = None) -> list[StoryPair]:
    """Reads one split ("train", "dev" or "test") from a data directory.

    Raises:
      TripDataError: unknown split, or the split is missing (the message lists what was found
        and how to get the data), or bad input.
    """
    if split not in SPLITS:
        raise TripDataError(f"unknown split {split!r}; expected one of {SPLITS} (subsets such as "
                            "test_curated are read by path with read_pairs)")
    files = find_split_files(data_dir)
    if split not in files:
        present = sorted(n for n in os.listdir(data_dir) if n.endswith((".jsonl", ".json")))
        found = ", ".join(f"{s}: {os.path.basename(p)}" for s, p in files.items()) or "none"
        raise TripDataError(
            f"{data_dir}: no {split!r} split. Splits found: {found}; TRIP files present: "
            f"{present or 'none'}. {GET_DATA_HINT}")
    path = files[split]
    is_release = os.path.basename(path) == RELEASE_FILENAME
    return read_pairs(path, format=format, split=split if is_release else None)
