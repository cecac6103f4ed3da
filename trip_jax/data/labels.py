"""Labels derived from typed stories: the conflict-label rule (docs/reference.md, "Labels")."""

from __future__ import annotations

import numpy as np

from trip_jax.data.types import Story


def conflict_labels(story: Story) -> np.ndarray:
    """Returns the {0,1} conflict labels of one story as int32 [num_entities, num_sentences].

    Only an implausible story has ones: an entity gets 1 at the evidence sentence i and at the
    breakpoint j if it has any non-zero state label (precondition or effect) at i or at j.
    """
    labels = np.zeros((story.num_entities, story.num_sentences), dtype=np.int32)
    conflict = story.conflict
    if story.plausible or conflict is None:
        return labels
    i, j = conflict
    involved = (story.states[:, [i, j]] != 0).any(axis=(1, 2, 3))
    labels[involved, i] = 1
    labels[involved, j] = 1
    return labels
