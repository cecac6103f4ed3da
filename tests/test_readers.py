"""Readers: the three TRIP formats, format detection, split discovery and every bad-input case."""

from __future__ import annotations

import copy
import os
import warnings

import numpy as np
import pytest

from trip_jax.data import schema
from trip_jax.data import readers
from trip_jax.data.readers import TripDataError
from trip_jax.data.record_checks import TripDataWarning

MOVEABLE = schema.ATTRIBUTE_INDEX["moveable"]
POWER = schema.ATTRIBUTE_INDEX["power"]
LOCATION = schema.ATTRIBUTE_INDEX["location"]
CONSCIOUS = schema.ATTRIBUTE_INDEX["conscious"]


def read_quietly(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # valid files must read without any warning
        return readers.read_pairs(path, **kwargs)


# --- CGLI ------------------------------------------------------------------------------------

def test_cgli_pairs_labels_ids_and_states(fx, tmp_path):
    path = fx.write_jsonl(tmp_path / "dev.cgli.jsonl", fx.cgli_records())
    pairs = read_quietly(path)
    assert [p.pair_id for p in pairs] == ["1-C0-1-C0", "1-C1-1-C1"]
    assert [p.label for p in pairs] == [0, 1]
    first, second = pairs
    assert first.stories[0].plausible and not first.stories[1].plausible
    assert first.implausible.story_id == "1-C0-1-C0"
    assert first.implausible.conflict == (0, 2) and second.implausible.conflict == (1, 2)
    story = first.stories[0]
    assert story.entities == ("John", "ball") and story.sentences == tuple(fx.SENTENCES)
    assert story.states.shape == (2, 3, 2, schema.NUM_ATTRIBUTES)
    assert story.states.dtype == np.int32
    assert (story.states[1, :, :, MOVEABLE] == 2).all() and story.states.sum() == 3 * 2 * 2


def test_cgli_detected_from_content(fx, tmp_path):
    path = fx.write_jsonl(tmp_path / "dev.json", fx.cgli_records())  # CGLI's own file name
    assert readers.detect_format(path) == "cgli"
    assert len(read_quietly(path)) == 2


def test_cgli_short_states_are_padded_and_reported_once(fx, tmp_path):
    records = fx.cgli_records()
    for r in records[:2]:
        r["states"] = [track[:2] for track in r["states"]]
    path = fx.write_jsonl(tmp_path / "test.cgli.jsonl", records)
    with pytest.warns(TripDataWarning) as caught:
        pairs = readers.read_pairs(path)
    messages = [str(w.message) for w in caught if w.category is TripDataWarning]
    assert len(messages) == 1 and "2 stories" in messages[0] and "test.cgli.jsonl" in messages[0]
    states = pairs[0].stories[0].states
    assert states.shape[1] == 3 and (states[:, 2] == 0).all()
    assert (states[1, :2, :, MOVEABLE] == 2).all()


def test_a_file_read_again_is_parsed_once_and_reported_each_time(fx, tmp_path, monkeypatch):
    records = fx.cgli_records()
    records[0]["states"] = [track[:2] for track in records[0]["states"]]
    path = fx.write_jsonl(tmp_path / "test.cgli.jsonl", records)
    with pytest.warns(TripDataWarning, match="1 stories"):
        first = readers.read_pairs(path)
    parsed = []
    monkeypatch.setattr(readers, "_read_cgli", lambda *args: parsed.append(args) or [])
    with pytest.warns(TripDataWarning, match="1 stories"):  # the repair is reported again
        again = readers.read_pairs(path)
    assert parsed == [] and again == first and again is not first
    with pytest.raises(ValueError, match="read-only"):  # no reader can change another's pairs
        again[0].stories[0].states[0, 0, 0, 0] = 1
    # The same path with other content (same size, within the same clock tick) is read anew.
    records[1]["para_id"] = records[1]["para_id"][:-1] + "X"
    fx.write_jsonl(path, records)
    assert readers.read_pairs(path) == [] and len(parsed) == 1


@pytest.mark.parametrize("line, mutate, field, problem", [
    (1, lambda r: r.pop("states"), "states", "missing"),
    (2, lambda r: r.pop("sentence_texts"), "sentence_texts", "missing"),
    (3, lambda r: r.pop("para_id"), "para_id", "missing"),
    (1, lambda r: r["states"][0].append(r["states"][0][0]), "states", "4 sentences"),
    (1, lambda r: r["states"].pop(), "states", "1 entity tracks for 2 entities"),
    (1, lambda r: r["states"][1][0][0].__setitem__(MOVEABLE, 3), "states", "out of range 0..2"),
    (1, lambda r: r["states"][1][2][1].__setitem__(LOCATION, 9), "states", "out of range 0..8"),
    (1, lambda r: r["states"][1][0][0].__setitem__(LOCATION, -1), "states", "out of range"),
    (1, lambda r: r["states"][1][0].append([0] * 20), "states", "shape"),
    (2, lambda r: r.__setitem__("confl_pairs", [[0, 7]]), "confl_pairs", "out of range"),
    (2, lambda r: r.__setitem__("confl_pairs", [[2, 1]]), "confl_pairs",
     "evidence sentence before"),
    (1, lambda r: r.__setitem__("plausible", "yes"), "plausible", "true/false"),
])
def test_cgli_bad_story_names_file_line_and_field(fx, tmp_path, line, mutate, field, problem):
    records = fx.cgli_records()
    mutate(records[line - 1])
    path = fx.write_jsonl(tmp_path / "dev.cgli.jsonl", records)
    with pytest.raises(TripDataError) as err:
        readers.read_pairs(path)
    message = str(err.value)
    assert "dev.cgli.jsonl" in message and f"line {line}" in message
    assert f"'{field}'" in message and problem in message


def test_cgli_pair_without_exactly_one_plausible_story(fx, tmp_path):
    records = fx.cgli_records()
    records[1] = fx.cgli_story("1-C0-1-C0", True)
    path = fx.write_jsonl(tmp_path / "dev.cgli.jsonl", records)
    with pytest.raises(TripDataError, match=r"lines 1-2 .*'plausible'.*exactly one plausible"):
        readers.read_pairs(path)


def test_cgli_odd_number_of_stories(fx, tmp_path):
    path = fx.write_jsonl(tmp_path / "dev.cgli.jsonl", fx.cgli_records()[:3])
    with pytest.raises(TripDataError, match=r"line 3: an odd number of stories"):
        readers.read_pairs(path)


def test_cgli_unreadable_json_names_the_line(fx, tmp_path):
    path = fx.write_jsonl(tmp_path / "dev.cgli.jsonl", fx.cgli_records())
    lines = open(path).read().splitlines()
    lines[2] = lines[2][:50]
    open(path, "w").write("\n".join(lines) + "\n")
    with pytest.raises(TripDataError, match=r"dev\.cgli\.jsonl: line 3: unreadable JSON"):
        readers.read_pairs(path)


# --- HAR -------------------------------------------------------------------------------------

def test_har_keeps_every_evidence_sentence(fx, tmp_path):
    path = fx.write_jsonl(tmp_path / "x.har.jsonl", fx.har_records())
    pairs = read_quietly(path)
    assert [p.pair_id for p in pairs] == ["dev_1", "dev_2"] and [p.label for p in pairs] == [0, 1]
    assert pairs[0].implausible.conflict_pairs == ((1, 2),)
    # confl_sents [0, 2] with breakpoint 1: both kept; the evidence is the one before it.
    story = pairs[1].implausible
    assert story.conflict_pairs == ((0, 1), (2, 1)) and story.conflict == (0, 1)
    assert story.story_id == "dev_2/0" and story.entities == ("John", "ball")


def test_har_latest_evidence_before_breakpoint(fx, tmp_path):
    records = fx.har_records()[:1]
    records[0]["stories"][1] = fx.har_story(False, 2, [0, 1], [[1, 2]])
    pairs = read_quietly(fx.write_jsonl(tmp_path / "x.har.jsonl", records))
    assert pairs[0].implausible.conflict_pairs == ((0, 2), (1, 2))
    assert pairs[0].implausible.conflict == (1, 2)


def test_har_detected_from_content(fx, tmp_path):
    path = fx.write_jsonl(tmp_path / "dev_curated_trip.json", fx.har_records())
    assert readers.detect_format(path) == "har"


@pytest.mark.parametrize("mutate, field, problem", [
    (lambda r: r.pop("pair_plausible_story"), "pair_plausible_story", "missing"),
    (lambda r: r.__setitem__("pair_plausible_story", 2), "pair_plausible_story", "out of range"),
    (lambda r: r.__setitem__("pair_plausible_story", 1), "pair_plausible_story", "story 0 is"),
    (lambda r: r["stories"].__setitem__(1, copy.deepcopy(r["stories"][0])), "plausible",
     "exactly one plausible"),
    (lambda r: r["stories"][0].__setitem__("confl_pairs", [[0, 1]]), "confl_pairs",
     "a plausible story lists conflicts"),
    (lambda r: r["stories"][0].pop("entities"), "entities", "missing"),
    (lambda r: r["stories"][1].pop("confl_sents"), "confl_sents", "missing"),
    (lambda r: r["stories"][1].__setitem__("breakpoint", 5), "breakpoint", "out of range"),
    (lambda r: r["stories"][1]["states"][0].pop(), "states", "fewer"),
    (lambda r: r["stories"][0]["states"][1][0][1].__setitem__(POWER, 7), "states", "out of range"),
    (lambda r: r["stories"].pop(), "stories", "expected two stories"),
])
def test_har_bad_pair_names_file_line_and_field(fx, tmp_path, mutate, field, problem):
    records = fx.har_records()
    mutate(records[0])
    path = fx.write_jsonl(tmp_path / "x.har.jsonl", records)
    if problem == "fewer":  # a short state track is padded and reported, not an error
        with pytest.warns(TripDataWarning, match="1 stories have states for fewer sentences"):
            readers.read_pairs(path)
        return
    with pytest.raises(TripDataError) as err:
        readers.read_pairs(path)
    message = str(err.value)
    assert "x.har.jsonl: line 1 (dev_1)" in message
    assert f"'{field}'" in message and problem in message


def test_har_unreadable_json(tmp_path):
    path = tmp_path / "x.har.jsonl"
    path.write_text('{"example_id": "dev_1",\n')
    with pytest.raises(TripDataError, match=r"line 1: unreadable JSON"):
        readers.read_pairs(str(path))


# --- release ---------------------------------------------------------------------------------

def test_release_converts_raw_labels_and_collects_entities(fx, tmp_path):
    path = fx.write_json(tmp_path / "www_2s_new.json", fx.release_data())
    pairs = read_quietly(path, split="dev")
    assert [p.pair_id for p in pairs] == ["1-C0", "2-C0"] and [p.label for p in pairs] == [0, 1]
    story = pairs[0].stories[0]
    assert story.story_id == "1" and story.plausible
    assert story.entities == ("John", "ball", "lamp")  # first appearance, "lamp" in sentence 1
    john, ball, lamp = story.states
    assert tuple(john[0, :, CONSCIOUS]) == (2, 2)
    assert tuple(ball[0, :, LOCATION]) == (2, 2)  # location keeps its own label on both sides
    assert tuple(ball[1, :, POWER]) == (2, 1)     # raw 3: true -> false
    assert tuple(lamp[1, :, POWER]) == (0, 2)     # raw 6: ? -> true
    assert lamp[0].sum() == 0 and lamp[2].sum() == 0
    implausible = pairs[1].implausible
    assert implausible.story_id == "2-C0" and implausible.conflict_pairs == ((0, 2), (1, 2))
    assert implausible.conflict == (1, 2)


def test_release_partitions_and_split_choice(fx, tmp_path):
    path = fx.write_json(tmp_path / "www_2s_new.json",
                         fx.release_data({"train": 3, "dev": 2, "test": 1}))
    assert readers.detect_format(path) == "release"
    assert len(read_quietly(path, split="train")) == 3
    assert {k: len(v) for k, v in readers.read_release_partitions(path).items()} == {
        "train": 3, "dev": 2, "test": 1}
    with pytest.raises(TripDataError, match="several partitions"):
        readers.read_pairs(path)
    with pytest.raises(TripDataError, match="no partition 'val'"):
        readers.read_pairs(path, split="val")
    single = fx.write_json(tmp_path / "one.json", fx.release_data())
    assert len(read_quietly(single)) == 2  # one non-empty partition: no split needed


def test_release_short_annotations_and_duplicates_are_reported(fx, tmp_path):
    data = fx.release_data()
    data[0]["dev"][0]["stories"][0]["states"].pop()
    data[0]["dev"][1]["stories"][0]["states"][0]["power"].append(["ball", 4])
    data[0]["dev"][1]["confl_pairs"].append([0, 1])  # a further conflict, not at the breakpoint
    path = fx.write_json(tmp_path / "www_2s_new.json", data)
    with pytest.warns(TripDataWarning) as caught:
        pairs = readers.read_pairs(path, split="dev")
    messages = " | ".join(str(w.message) for w in caught)
    assert "1 stories have states for fewer sentences" in messages
    assert "1 (entity, sentence, attribute) labels were given twice" in messages
    assert "1 conflicting sentence pairs do not end at" in messages and "2-C0 (0, 1)" in messages
    assert pairs[1].implausible.conflict_pairs == ((0, 2), (1, 2))
    assert pairs[0].stories[0].states.shape[1] == 3
    assert tuple(pairs[1].stories[0].states[1, 0, :, POWER]) == (1, 2)  # the last one is kept


@pytest.mark.parametrize("mutate, field, problem", [
    (lambda p: p.pop("label"), "label", "missing"),
    (lambda p: p.__setitem__("label", -1), "label", "out of range"),
    (lambda p: p.pop("confl_sents"), "confl_sents", "missing"),
    (lambda p: p["stories"][0].pop("sentences"), "sentences", "missing"),
    (lambda p: p["stories"][0].__setitem__("plausible", False), "plausible", "disagrees"),
    (lambda p: p["stories"][1]["states"].append({}), "states", "4 sentences"),
    (lambda p: p["stories"][1]["states"][0].__setitem__("colour", [["ball", 1]]), "states[0]",
     "unknown attribute"),
    (lambda p: p["stories"][1]["states"][1]["power"].__setitem__(0, ["ball", 9]), "states[1].power",
     "out of range 0..8"),
    (lambda p: p["stories"][1]["states"][0]["location"].__setitem__(0, ["ball", 9]),
     "states[0].location", "out of range 0..8"),
    (lambda p: p["stories"][1]["states"][0]["h_location"].__setitem__(0, ["John", 3]),
     "states[0].h_location", "out of range 0..2"),
    (lambda p: p["stories"][1]["states"][0]["power"].__setitem__(0, "ball"), "states[0].power",
     "expected [entity, label]"),
])
def test_release_bad_pair_names_file_pair_and_field(fx, tmp_path, mutate, field, problem):
    data = fx.release_data()
    mutate(data[0]["dev"][0])
    path = fx.write_json(tmp_path / "www_2s_new.json", data)
    with pytest.raises(TripDataError) as err:
        readers.read_pairs(path, split="dev")
    message = str(err.value)
    assert "www_2s_new.json: dev pair 0 (1-C0)" in message
    assert f"'{field}'" in message and problem in message


def test_release_unreadable_json(tmp_path):
    path = tmp_path / "www_2s_new.json"
    path.write_text('[{"dev": [}]')
    with pytest.raises(TripDataError, match=r"www_2s_new\.json: unreadable JSON"):
        readers.read_pairs(str(path), format="release")


# --- detection, splits and the data directory --------------------------------------------------

def test_unknown_format_is_a_clear_error(fx, tmp_path):
    path = fx.write_jsonl(tmp_path / "other.json", [{"id": 1}])
    with pytest.raises(TripDataError, match="cannot tell the TRIP format"):
        readers.read_pairs(path)
    with pytest.raises(TripDataError, match="unknown format 'csv'"):
        readers.read_pairs(path, format="csv")
    with pytest.raises(TripDataError, match="no such file"):
        readers.read_pairs(str(tmp_path / "missing.cgli.jsonl"))


def test_find_and_load_splits(fx, tmp_path):
    fx.write_jsonl(tmp_path / "dev.cgli.jsonl", fx.cgli_records())
    fx.write_jsonl(tmp_path / "test_curated.har.jsonl", fx.har_records())  # a subset: never a split
    assert readers.find_split_files(str(tmp_path)) == {"dev": str(tmp_path / "dev.cgli.jsonl")}
    assert len(readers.load_split(str(tmp_path), "dev")) == 2
    with pytest.raises(TripDataError) as err:
        readers.load_split(str(tmp_path), "test")
    message = str(err.value)
    assert "no 'test' split" in message and "dev: dev.cgli.jsonl" in message
    assert "test_curated.har.jsonl" in message and "download" in message
    with pytest.raises(TripDataError, match="unknown split 'test_curated'"):
        readers.load_split(str(tmp_path), "test_curated")


def test_release_in_data_dir_provides_every_split(fx, tmp_path):
    release = fx.write_json(tmp_path / readers.RELEASE_FILENAME,
                            fx.release_data({"train": 3, "dev": 2, "test": 1}))
    fx.write_jsonl(tmp_path / "dev.cgli.jsonl", fx.cgli_records())
    files = readers.find_split_files(str(tmp_path))
    assert files == {"train": release, "dev": str(tmp_path / "dev.cgli.jsonl"), "test": release}
    assert len(readers.load_split(str(tmp_path), "train")) == 3
    assert readers.load_split(str(tmp_path), "dev")[0].pair_id == "1-C0-1-C0"  # per-split file wins
    assert len(readers.load_split(str(tmp_path), "test")) == 1


def test_default_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(readers.DATA_DIR_ENV, str(tmp_path))
    assert readers.default_data_dir() == str(tmp_path)
    assert readers.default_data_dir("/given") == "/given"
    monkeypatch.delenv(readers.DATA_DIR_ENV)
    with pytest.raises(TripDataError, match=r"set \$TRIP_DATA_DIR"):
        readers.default_data_dir()
    with pytest.raises(TripDataError, match="no such directory"):
        readers.find_split_files(os.path.join(str(tmp_path), "absent"))
