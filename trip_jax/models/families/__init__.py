"""One module per encoder family (``trip_jax.encoder_registry.Family``); the list: its ``UNITS``."""
