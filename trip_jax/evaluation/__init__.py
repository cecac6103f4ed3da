"""Evaluation: evaluator, decoding, metrics, reports, explanations, predict."""
