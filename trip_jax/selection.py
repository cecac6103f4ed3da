"""Checkpoint selection: which held-out evaluation's parameters become the selected checkpoint.

Every selection evaluation gets a ``selection_score``; the selected checkpoint
(``checkpoints/selected``) is the one of the highest score, ties broken by
verifiability, then consistency, then accuracy (``checkpoints.RANKING``). The rules
(``config.train.selection``):

- ``verifiability`` (the reference): the evaluation's verifiability.
- ``smoothed``: the mean of consistency + verifiability over the last ``window`` evaluations.
  On a held-out slice of 68 pairs one pair moves a tier by 1.5 points, and the reference rule
  picks whichever evaluation got lucky on a few pairs; the sum of two tiers and the mean over
  neighbouring evaluations move less. An evaluation whose window is not yet full (the first
  ``window - 1`` of a run) scores its partial mean minus ``PARTIAL_WINDOW_PENALTY``: a mean
  over fewer evaluations is noisier, so it would win the maximum by luck more often (a
  MiniLM run here selected its epoch-1 checkpoint that way, docs/results.md). It still ranks
  the evaluations of a run shorter than its window among themselves.

The history the smoothed score needs is kept in the latest checkpoint's metadata, so a resumed
run scores its evaluations as an uninterrupted one (and every process computes the same score).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SELECTIONS: tuple[str, ...] = ("verifiability", "smoothed")
# consistency + verifiability lies in [0, 2]: a partial window's score falls below every full one.
PARTIAL_WINDOW_PENALTY = 2.0


def check_selection(rule: str, window: int) -> None:
    """Raises ValueError for an unknown rule or a window below 1."""
    if rule not in SELECTIONS:
        raise ValueError(f"unknown train.selection {rule!r}; expected one of {SELECTIONS}")
    if window < 1:
        raise ValueError(f"train.selection_window must be >= 1, got {window}")


def selection_score(history: Sequence[Mapping[str, float]], rule: str, window: int) -> float:
    """The selection score of the last evaluation of ``history`` (oldest first; each entry holds
    at least consistency and verifiability) under ``rule`` (module docstring)."""
    check_selection(rule, window)
    if not history:
        raise ValueError("no evaluation to score")
    if rule == "verifiability":
        return float(history[-1]["verifiability"])
    recent = history[-window:]
    mean = sum(float(h["consistency"]) + float(h["verifiability"]) for h in recent) / len(recent)
    return mean if len(recent) == window else mean - PARTIAL_WINDOW_PENALTY
