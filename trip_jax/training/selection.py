"""Checkpoint selection: the ``selection_score`` of each held-out evaluation.

``config.train.selection`` is ``verifiability`` (the reference) or ``smoothed`` (a window mean);
the history lives in the latest checkpoint, so a resumed run scores as an uninterrupted one.
Details: docs/reference.md#decoding ("Selection").
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
