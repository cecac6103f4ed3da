"""Checkpoint selection: the ``selection_score`` of each held-out evaluation.

The selected checkpoint (``checkpoints/selected``) is the evaluation of the highest score, ties
broken by verifiability, consistency, accuracy (``checkpoints.RANKING``). With h the last
``window`` entries of the history (oldest first), ``config.train.selection`` gives:

- ``verifiability`` (the reference): the last evaluation's verifiability;
- ``smoothed``: mean over h of (consistency + verifiability), minus ``PARTIAL_WINDOW_PENALTY``
  while h holds fewer than ``window`` entries (so a partial window ranks below every full one).

The history lives in the latest checkpoint's metadata, so a resumed run scores as an
uninterrupted one. Why these rules: docs/reference.md, "Decoding" (selection paragraph).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# consistency + verifiability lies in [0, 2]: a partial window's score falls below every full one.
PARTIAL_WINDOW_PENALTY = 2.0


def selection_score(history: Sequence[Mapping[str, float]], rule: str, window: int) -> float:
    """The selection score of the last evaluation of ``history`` (oldest first; each entry holds
    at least consistency and verifiability) under ``rule`` (module docstring; ``rule`` and
    ``window`` are train.selection and train.selection_window, checked by the schema)."""
    if not history:
        raise ValueError("no evaluation to score")
    if rule == "verifiability":
        return float(history[-1]["verifiability"])
    recent = history[-window:]
    mean = sum(float(h["consistency"]) + float(h["verifiability"]) for h in recent) / len(recent)
    return mean if len(recent) == window else mean - PARTIAL_WINDOW_PENALTY
