"""Table-1 statistics of TRIP splits (paper, Table 1), from typed story pairs.

Every story is counted once; measures the data cannot give are left out; state labels are
counted two ways. Details: docs/reference.md#task-and-data ("Side tools").
"""

from __future__ import annotations

import numpy as np

from trip_jax.data import readers
from trip_jax.data.types import Story, StoryPair

# (key, row title) in the order of the paper's table.
MEASURES: tuple[tuple[str, str], ...] = (
    ("pairs", "# story pairs"),
    ("plausible_stories", "# plausible stories"),
    ("implausible_stories", "# implausible stories"),
    ("avg_sentences", "avg. # sentences"),
    ("avg_sentence_length_words", "avg. sentence length (words)"),
    ("avg_entities", "avg. # entities"),
    ("conflicting_sentence_pairs", "# conflicting sentence pairs"),
    ("avg_conflicting_sentence_pairs", "avg. # conflicting sentence pairs"),
    ("physical_state_labels", "# physical state labels (non-zero pre/effect)"),
    ("physical_state_annotations", "# (entity, sentence, attribute) with a label"),
)


def unique_stories(pairs: list[StoryPair]) -> list[Story]:
    """Returns every distinct story of ``pairs`` once, in first-appearance order."""
    seen: dict[tuple, Story] = {}
    for pair in pairs:
        for story in pair.stories:
            seen.setdefault((story.sentences, story.plausible), story)
    return list(seen.values())


def split_stats(pairs: list[StoryPair]) -> dict[str, float | int]:
    """Computes the Table-1 measures of one split; averages are per distinct story."""
    stories = unique_stories(pairs)
    implausible = [s for s in stories if not s.plausible]
    words = [len(sentence.split()) for s in stories for sentence in s.sentences]
    conflicts = sum(len(s.conflict_pairs) for s in implausible)
    per_story = round(conflicts / len(implausible), 4) if implausible else 0.0
    return {
        "pairs": len(pairs),
        "plausible_stories": len(stories) - len(implausible),
        "implausible_stories": len(implausible),
        "avg_sentences": _mean([s.num_sentences for s in stories]),
        "avg_sentence_length_words": _mean(words),
        "avg_entities": _mean([s.num_entities for s in stories]),
        "conflicting_sentence_pairs": conflicts,
        "avg_conflicting_sentence_pairs": per_story,
        "physical_state_labels": int(sum(np.count_nonzero(s.states) for s in stories)),
        "physical_state_annotations": int(sum(
            np.count_nonzero((s.states != 0).any(axis=2)) for s in stories)),
    }


def _mean(values: list[int]) -> float:
    return round(float(np.mean(values)), 4) if values else 0.0


def data_dir_stats(data_dir: str) -> tuple[dict[str, dict], dict[str, str]]:
    """Computes ``split_stats`` for every split found in ``data_dir``.

    Returns:
      ({split: stats}, {split: file}) for the splits found, in train/dev/test order.
    """
    files = readers.find_split_files(data_dir)
    if not files:
        raise readers.TripDataError(f"{data_dir}: no TRIP split files found. "
                                    f"{readers.GET_DATA_HINT}")
    return {split: split_stats(readers.load_split(data_dir, split)) for split in files}, files


def format_table(stats: dict[str, dict]) -> str:
    """Renders ``{split: stats}`` as a plain-text table with one column per split."""
    splits = list(stats)
    title_width = max(len(title) for _, title in MEASURES)
    lines = ["Measure".ljust(title_width) + "".join(f"{s:>12}" for s in splits)]
    for key, title in MEASURES:
        cells = []
        for split in splits:
            value = stats[split][key]
            cells.append(f"{value:>12.2f}" if isinstance(value, float) else f"{value:>12,d}")
        lines.append(title.ljust(title_width) + "".join(cells))
    return "\n".join(lines)
