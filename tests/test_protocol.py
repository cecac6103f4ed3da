"""Protocol selection and the dev-train held-out slice."""

from __future__ import annotations


import pytest
from ml_collections import ConfigDict

from trip_jax.config.sections import DataConfig
from trip_jax.data import protocol
from trip_jax.data import readers



@pytest.fixture(scope="module")
def dev(data_dir):
    return readers.load_split(data_dir, "dev")


def plausible(pair):
    return pair.stories[pair.label].sentences


def test_holdout_is_deterministic_and_keeps_plausible_stories_apart(dev):
    kept, held = protocol.holdout_split(dev, 0.2, seed=0)
    assert len(kept) + len(held) == len(dev)
    assert {p.pair_id for p in kept}.isdisjoint(p.pair_id for p in held)
    # No plausible story is on both sides (its pairs share it).
    assert {plausible(p) for p in kept}.isdisjoint(plausible(p) for p in held)
    groups = len({plausible(p) for p in dev})
    assert len({plausible(p) for p in held}) == round(0.2 * groups)
    again, _ = protocol.holdout_split(dev, 0.2, seed=0)
    assert [p.pair_id for p in again] == [p.pair_id for p in kept]
    other, _ = protocol.holdout_split(dev, 0.2, seed=1)
    assert [p.pair_id for p in other] != [p.pair_id for p in kept]


def test_holdout_needs_two_groups(dev):
    same_story = [p for p in dev if plausible(p) == plausible(dev[0])]
    with pytest.raises(ValueError, match="at least 2"):
        protocol.holdout_split(same_story, 0.5, seed=0)
    with pytest.raises(ValueError, match="holdout_fraction"):
        protocol.holdout_split(dev, 1.0, seed=0)


def test_auto_protocol_follows_the_available_splits():
    assert protocol.resolve_protocol("auto", ["train", "dev", "test"]) == "standard"
    assert protocol.resolve_protocol("auto", ["dev", "test"]) == "dev_train"
    assert protocol.resolve_protocol("standard", ["dev", "test"]) == "standard"
    with pytest.raises(ValueError, match="data.protocol: unknown value 'dev'"):
        DataConfig(protocol="dev")  # checked once, by the schema


def test_splits_of_the_shared_data(data_dir):
    config = ConfigDict(dict(data_dir=data_dir, format="", protocol="auto", holdout_fraction=0.2,
                             holdout_seed=0, max_pairs=0))
    splits = protocol.load_protocol_splits(config)
    assert splits.protocol == "dev_train" and splits.selection_name == "dev_holdout"
    assert len(splits.train) + len(splits.selection) == 322
    assert len(splits.test) == 351
    assert set(splits.files) == {"dev", "test"}
    config.protocol = "standard"
    with pytest.raises(readers.TripDataError, match="no 'train' split"):
        protocol.load_protocol_splits(config)


def test_cv_folds_group_plausible_stories_and_ignore_order(dev):
    folds = protocol.cv_folds(dev, 5)
    assert sorted(set(folds)) == [0, 1, 2, 3, 4]
    # Every pair of one plausible story sits in one fold.
    fold_of_story = {}
    for pair, fold in zip(dev, folds):
        assert fold_of_story.setdefault(plausible(pair), fold) == fold
    # Balanced by stories (ranks r % 5), so by pairs within a few.
    sizes = [folds.count(f) for f in range(5)]
    assert sum(sizes) == len(dev) and max(sizes) - min(sizes) <= 15
    # Fixed by the data: the same pair gets the same fold in any order.
    reversed_folds = protocol.cv_folds(dev[::-1], 5)
    assert reversed_folds[::-1] == folds


def test_cv_split_and_its_bad_values(dev):
    train, held = protocol.cv_split(dev, 5, 2)
    assert len(train) + len(held) == len(dev)
    assert {plausible(p) for p in train}.isdisjoint(plausible(p) for p in held)
    assert [p.pair_id for p in held] == [p.pair_id for p, f in
                                         zip(dev, protocol.cv_folds(dev, 5)) if f == 2]
    every = [p.pair_id for f in range(5) for p in protocol.cv_split(dev, 5, f)[1]]
    assert sorted(every) == sorted(p.pair_id for p in dev)  # each pair held out once
    with pytest.raises(ValueError, match="data.fold must be in 0 .. 4"):
        protocol.cv_split(dev, 5, 5)
    with pytest.raises(ValueError, match="data.folds must be between 2 and the 152"):
        protocol.cv_folds(dev, 1)


def test_cv_and_dev_all_splits_of_the_shared_data(data_dir):
    config = ConfigDict(dict(data_dir=data_dir, format="", protocol="dev_cv", folds=5, fold=1,
                             holdout_fraction=0.2, holdout_seed=0, max_pairs=0))
    splits = protocol.load_protocol_splits(config)
    assert splits.selection_name == "dev_fold" and splits.test == []
    assert set(splits.files) == {"dev"}  # test is never read
    assert len(splits.train) + len(splits.selection) == 322
    config.protocol = "dev_all"
    splits = protocol.load_protocol_splits(config)
    assert (len(splits.train), len(splits.selection), len(splits.test)) == (322, 0, 351)
