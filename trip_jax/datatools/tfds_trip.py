"""A tensorflow-datasets builder named ``trip`` (array_record files, no TensorFlow needed).

Built with ``python -m trip_jax.datatools tfds_build --manual_dir=DIR`` from TRIP files in any format
the readers know; read back with ``tfds.data_source`` and ``pairs_from_tfds``. One example is one
story pair. Details: docs/reference.md#task-and-data ("Side tools").
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow_datasets as tfds

from trip_jax.data import schema
from trip_jax.data import readers
from trip_jax.data.types import Story, StoryPair

FILE_FORMAT = "array_record"


class Trip(tfds.core.GeneratorBasedBuilder):
    """TRIP story pairs (Storks et al., 2021) with entities, states and conflicts."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Story pairs from the CGLI, HAR or release formats."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Put the TRIP files in the manual directory: the authors' www_2s_new.json (all three "
        "splits; `python -m trip_jax.datatools download --dest=DIR` fetches it) and/or per-split files "
        "train.cgli.jsonl, dev.cgli.jsonl, test.cgli.jsonl (or {split}.har.jsonl). Splits that "
        "have no file are not built.")

    def _info(self) -> tfds.core.DatasetInfo:
        story = tfds.features.FeaturesDict({
            "story_id": tfds.features.Text(),
            "sentences": tfds.features.Sequence(tfds.features.Text()),
            "entities": tfds.features.Sequence(tfds.features.Text()),
            "states": tfds.features.Tensor(shape=(None, None, 2, schema.NUM_ATTRIBUTES),
                                           dtype=np.int32, encoding="zlib"),
            "plausible": np.bool_,
            "conflict_pairs": tfds.features.Tensor(shape=(None, 2), dtype=np.int32),
        })
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__.split("\n\n")[0],
            features=tfds.features.FeaturesDict({
                "pair_id": tfds.features.Text(),
                "index": np.int32,
                "label": np.int32,
                "story0": story,
                "story1": story,
            }),
            homepage="https://github.com/sled-group/Verifiable-Coherent-NLU",
        )

    def _split_generators(self, dl_manager):
        manual_dir = str(dl_manager.manual_dir)
        files = _split_files(manual_dir)
        missing = [s for s in readers.SPLITS if s not in files]
        if missing:
            logging.warning("trip: %s has no file for %s; building only %s", manual_dir,
                            missing, list(files))
        return {split: self._generate_examples(manual_dir, split) for split in files}

    def _generate_examples(self, manual_dir: str, split: str):
        for index, pair in enumerate(readers.load_split(manual_dir, split)):
            yield index, encode_pair(pair, index)


def _split_files(manual_dir: str) -> dict[str, str]:
    files = readers.find_split_files(manual_dir)
    if not files:
        raise readers.TripDataError(
            f"{manual_dir}: no TRIP split files. {Trip.MANUAL_DOWNLOAD_INSTRUCTIONS}")
    return files


def _encode_story(story: Story) -> dict:
    return {
        "story_id": story.story_id,
        "sentences": list(story.sentences),
        "entities": list(story.entities),
        "states": story.states.astype(np.int32),
        "plausible": story.plausible,
        "conflict_pairs": np.asarray(story.conflict_pairs, dtype=np.int32).reshape(-1, 2),
    }


def encode_pair(pair: StoryPair, index: int) -> dict:
    """Turns a StoryPair into the builder's feature dict."""
    return {"pair_id": pair.pair_id, "index": index, "label": pair.label,
            "story0": _encode_story(pair.stories[0]), "story1": _encode_story(pair.stories[1])}


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _decode_story(example: dict) -> Story:
    sentences = tuple(_text(s) for s in example["sentences"])
    entities = tuple(_text(e) for e in example["entities"])
    states = np.asarray(example["states"], dtype=np.int32).reshape(
        len(entities), len(sentences), 2, schema.NUM_ATTRIBUTES)
    pairs = tuple((int(i), int(j)) for i, j in np.asarray(example["conflict_pairs"]).reshape(-1, 2))
    return Story(story_id=_text(example["story_id"]), sentences=sentences, entities=entities,
                 states=states, plausible=bool(example["plausible"]), conflict_pairs=pairs)


def decode_pair(example: dict) -> StoryPair:
    """Turns one example read from the builder back into a StoryPair."""
    return StoryPair(pair_id=_text(example["pair_id"]),
                     stories=(_decode_story(example["story0"]), _decode_story(example["story1"])),
                     label=int(example["label"]))


def pairs_from_tfds(data_source) -> list[StoryPair]:
    """Reads every example of a ``tfds`` data source as StoryPairs, in source-file order."""
    examples = [data_source[i] for i in range(len(data_source))]
    examples.sort(key=lambda ex: int(ex["index"]))
    return [decode_pair(ex) for ex in examples]


def build(manual_dir: str, tfds_dir: str | None = None) -> Trip:
    """Builds the ``trip`` dataset from ``manual_dir`` into ``tfds_dir``.

    An existing build of the same version in ``tfds_dir`` is reused as it is; delete
    ``tfds_dir/trip`` to rebuild from changed files.
    """
    _split_files(manual_dir)  # a clear error before tfds asserts on an empty directory
    builder = Trip(data_dir=tfds_dir, file_format=FILE_FORMAT)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
    return builder


def load_split(split: str, tfds_dir: str | None = None):
    """Returns the data source of one built split; a clear error lists the splits built."""
    builder = Trip(data_dir=tfds_dir, file_format=FILE_FORMAT)
    if not builder.is_prepared():
        raise readers.TripDataError(
            f"the trip dataset is not built in {builder.data_dir}; run "
            "`python -m trip_jax.datatools tfds_build --manual_dir=DIR` first")
    built = list(builder.info.splits)
    if split not in built:
        raise readers.TripDataError(
            f"the trip dataset in {builder.data_dir} has no {split!r} split; splits built: "
            f"{built}. {Trip.MANUAL_DOWNLOAD_INSTRUCTIONS}")
    return builder.as_data_source(split=split)
