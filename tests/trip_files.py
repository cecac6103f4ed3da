"""Small TRIP files in the three formats, written by tests into temporary directories (the
``fx`` fixture of conftest.py)."""

from __future__ import annotations

import copy
import json

from trip_jax.data import schema

SENTENCES = ["John took the ball.", "John threw the ball.", "John caught the ball."]
ENTITIES = ["John", "ball"]


def dense_states(num_entities: int = 2, num_sentences: int = 3, label: int = 2) -> list:
    """[entity][sentence][pre/effect][20] labels; entity 1 ("ball") is 'moveable' everywhere."""
    states = [[[[0] * schema.NUM_ATTRIBUTES for _ in range(2)] for _ in range(num_sentences)]
              for _ in range(num_entities)]
    moveable = schema.ATTRIBUTE_INDEX["moveable"]
    for s in range(num_sentences):
        for side in range(2):
            states[min(1, num_entities - 1)][s][side][moveable] = label
    return states


def cgli_story(para_id: str, plausible: bool, confl_pairs=None, sentences=None) -> dict:
    """One CGLI line."""
    sentences = list(sentences or SENTENCES)
    return {"para_id": para_id, "sentence_texts": sentences, "plausible": plausible,
            "confl_pairs": [] if plausible else (confl_pairs or [[0, 2]]),
            "participants": list(ENTITIES), "states": dense_states(2, len(sentences))}


def cgli_records() -> list[dict]:
    """Two pairs; the plausible story comes first in one and second in the other."""
    implausible = SENTENCES[:2] + ["John threw the ball again."]
    return [cgli_story("1-C0-1", True), cgli_story("1-C0-1-C0", False, sentences=implausible),
            cgli_story("1-C1-1-C1", False, [[1, 2]], implausible), cgli_story("1-C1-1", True)]


def har_story(plausible: bool, breakpoint: int = -1, confl_sents=(), confl_pairs=()) -> dict:
    """One story of a HAR pair."""
    return {"sentences": list(SENTENCES), "plausible": int(plausible), "breakpoint": breakpoint,
            "confl_sents": list(confl_sents), "confl_pairs": [list(p) for p in confl_pairs],
            "entities": list(ENTITIES), "entities_by_sentence": [ENTITIES] * 3,
            "states": dense_states()}


def har_records() -> list[dict]:
    """Two pairs; the second lists several evidence sentences, one after the breakpoint."""
    return [
        {"example_id": "dev_1", "pair_plausible_story": 0,
         "stories": [har_story(True), har_story(False, 2, [1], [[1, 2]])]},
        {"example_id": "dev_2", "pair_plausible_story": 1,
         "stories": [har_story(False, 1, [0, 2], [[0, 1]]), har_story(True)]},
    ]


def release_story(example_id: str, plausible: bool, num_states: int = 3) -> dict:
    """One story of a release pair with raw change-direction labels."""
    states = []
    for s in range(num_states):
        annotation = {"h_location": [["John", 0]], "conscious": [["John", 2]],
                      "location": [["ball", 2 if s == 0 else 0]], "power": [["ball", 0]]}
        if s == 1:
            annotation["power"] = [["ball", 3], ["lamp", 6]]  # true -> false; ? -> true
        states.append(annotation)
    return {"example_id": example_id, "sentences": list(SENTENCES), "plausible": plausible,
            "breakpoint": -1 if plausible else 2, "confl_sents": [] if plausible else [0, 1],
            "confl_pairs": [] if plausible else [[1, 2]], "states": states}


def release_pair(pair_id: str = "1-C0", label: int = 0) -> dict:
    """One release pair; ``label`` is the index of the plausible story."""
    stories = [release_story("1", True), release_story(pair_id, False)]
    if label == 1:
        stories.reverse()
    return {"example_id": pair_id, "label": label, "breakpoint": 2, "confl_sents": [0, 1],
            "confl_pairs": [[1, 2]], "stories": stories}


def release_data(partitions: dict[str, int] | None = None) -> list:
    """``[cloze, order]`` with ``partitions[name]`` pairs per partition (default: dev 2)."""
    partitions = partitions if partitions is not None else {"train": 0, "dev": 2, "test": 0}
    cloze = {name: [release_pair(f"{i + 1}-C0", i % 2) for i in range(n)]
             for name, n in partitions.items()}
    return [cloze, {name: [] for name in partitions}]


def write_jsonl(path, records: list) -> str:
    """Writes one JSON object a line and returns the path as a string."""
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    return str(path)


def write_json(path, data) -> str:
    """Writes one JSON document and returns the path as a string."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return str(path)


def copy_of(records):
    """A deep copy, for tests that break one field."""
    return copy.deepcopy(records)
