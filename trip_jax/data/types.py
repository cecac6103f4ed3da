"""Typed TRIP examples: every reader turns its format into these, everything downstream reads them.

A ``StoryPair`` holds two ``Story`` objects of which exactly one is plausible. Stories keep their
own entity lists (the two stories of a pair may differ) and states as an int array
``[entity, sentence, 2 (precondition, effect), 20 attributes]``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from trip_jax.data import schema


@dataclasses.dataclass(frozen=True, eq=False)
class Story:
    """One story: sentences, entities, state labels and, if implausible, its conflict."""

    story_id: str
    sentences: tuple[str, ...]
    entities: tuple[str, ...]
    # int32 [num_entities, num_sentences, 2, NUM_ATTRIBUTES]: [..., 0, :] precondition, [..., 1, :] effect.
    states: np.ndarray
    plausible: bool
    # (evidence i, breakpoint j) pairs as the data lists them; empty for a plausible story.
    conflict_pairs: tuple[tuple[int, int], ...] = ()

    @property
    def num_sentences(self) -> int:
        """Number of sentences in the story."""
        return len(self.sentences)

    @property
    def num_entities(self) -> int:
        """Number of entities with a state track in the story."""
        return len(self.entities)

    @property
    def breakpoint(self) -> int | None:
        """First sentence where the story becomes implausible (None if plausible)."""
        if not self.conflict_pairs:
            return None
        return max(j for _, j in self.conflict_pairs)

    @property
    def evidence(self) -> int | None:
        """Evidence sentence: the latest one listed before the breakpoint (docs/reference.md,
        "Labels")."""
        j = self.breakpoint
        if j is None:
            return None
        before = [i for i, jj in self.conflict_pairs if jj == j and i < j]
        return max(before) if before else None

    @property
    def conflict(self) -> tuple[int, int] | None:
        """The single (evidence, breakpoint) pair the model is trained and scored on."""
        if self.breakpoint is None or self.evidence is None:
            return None
        return self.evidence, self.breakpoint


@dataclasses.dataclass(frozen=True, eq=False)
class StoryPair:
    """Two stories differing in one sentence; ``label`` is the index of the plausible one."""

    pair_id: str
    stories: tuple[Story, Story]
    label: int

    @property
    def implausible(self) -> Story:
        """The implausible story of the pair."""
        return self.stories[1 - self.label]


def empty_states(num_entities: int, num_sentences: int) -> np.ndarray:
    """Returns an all-zero state array of the canonical shape and dtype."""
    return np.zeros((num_entities, num_sentences, 2, schema.NUM_ATTRIBUTES), dtype=np.int32)
