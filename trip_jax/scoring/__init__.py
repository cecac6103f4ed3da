"""Another system's answers, for python -m trip_jax.score: prediction file formats and matching."""
