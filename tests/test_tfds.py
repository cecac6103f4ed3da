"""The tfds 'trip' builder: build from a manual directory in a temp dir, read back without TF."""

from __future__ import annotations

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from trip_jax.data import readers  # noqa: E402
from trip_jax.datatools import tfds_trip  # noqa: E402


def assert_same_pairs(got, expected):
    assert [p.pair_id for p in got] == [p.pair_id for p in expected]
    assert [p.label for p in got] == [p.label for p in expected]
    for pair, reference in zip(got, expected):
        for story, ref in zip(pair.stories, reference.stories):
            assert story.story_id == ref.story_id and story.sentences == ref.sentences
            assert story.entities == ref.entities and story.plausible == ref.plausible
            assert story.conflict_pairs == ref.conflict_pairs
            assert story.states.dtype == np.int32 and np.array_equal(story.states, ref.states)


def test_build_and_read_through_data_source(fx, tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    dev = readers.read_pairs(fx.write_jsonl(manual / "dev.cgli.jsonl", fx.cgli_records()))
    test = readers.read_pairs(fx.write_jsonl(manual / "test.har.jsonl", fx.har_records()))
    out = str(tmp_path / "tfds")
    builder = tfds_trip.build(str(manual), out)
    assert sorted(builder.info.splits) == ["dev", "test"]

    source = tfds.data_source("trip", split="dev", data_dir=out)  # no TensorFlow involved
    assert len(source) == 2
    assert_same_pairs(tfds_trip.pairs_from_tfds(source), dev)
    assert_same_pairs(tfds_trip.pairs_from_tfds(tfds_trip.load_split("test", out)), test)
    # Several evidence sentences survive the round trip; the conflict is the latest before j.
    assert tfds_trip.pairs_from_tfds(source)[0].implausible.conflict == (0, 2)

    with pytest.raises(readers.TripDataError,
                       match=r"no 'train' split; splits built: \['dev', 'test'\]"):
        tfds_trip.load_split("train", out)


def test_build_from_release_and_missing_data(fx, tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    with pytest.raises(readers.TripDataError, match="no TRIP split files"):
        tfds_trip.build(str(manual), str(tmp_path / "empty"))
    with pytest.raises(readers.TripDataError, match="not built"):
        tfds_trip.load_split("dev", str(tmp_path / "never"))
    counts = {"train": 2, "dev": 1, "test": 1}
    fx.write_json(manual / readers.RELEASE_FILENAME, fx.release_data(counts))
    builder = tfds_trip.build(str(manual), str(tmp_path / "tfds"))
    assert {k: v.num_examples for k, v in builder.info.splits.items()} == counts
    pairs = tfds_trip.pairs_from_tfds(tfds_trip.load_split("train", str(tmp_path / "tfds")))
    assert [p.pair_id for p in pairs] == ["1-C0", "2-C0"]
    assert pairs[0].stories[0].entities == ("John", "ball", "lamp")
