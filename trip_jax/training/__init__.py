"""Training: the train state and the jitted train step (the loop is trip_jax/train.py)."""
