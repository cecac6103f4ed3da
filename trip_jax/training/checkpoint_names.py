"""The names of a workdir's checkpoints and config file: plain strings, so that the command line
checks ``--checkpoint`` without importing JAX or orbax (``trip_jax/training/checkpoints.py``
uses the same names)."""

LATEST = "latest"
SELECTED = "selected"
BEST_ACCURACY = "best_accuracy"
KINDS: tuple[str, ...] = (LATEST, SELECTED, BEST_ACCURACY)
CONFIG_FILE = "config.json"
