"""The pieces that reproduce the original implementation's step (the exact mode's keys)."""
