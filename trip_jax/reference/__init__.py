"""The pieces that reproduce the original implementation's step, each chosen from the config."""
