r"""A tiny random model on a few pairs: the whole loop in seconds on CPU (tests, smoke runs).

2-layer BERT-style encoder of width 32 over a word-level vocabulary built from the data, a
1-layer conflict detector, the first 8 dev pairs (dev-train protocol) and 8 test pairs, 2 epochs,
one batch shape per split (so each step function compiles once per split).

Command (from the repository root, TRIP_DATA_DIR pointing at the data):

  python -m trip_jax.main --config=configs/tiny.py --workdir=/tmp/trip_tiny

Expected result: a finished run with reports/test.md; the scores are those of an untrained model
(near the random baseline) and mean nothing. ``configs/tiny.py:exact`` runs the same loop in the
exact reference mode (docs/exact-mode.md).
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the tiny configuration (argument: mode and/or Table 2 loss preset,
    configs/base.py; default mode clean)."""
    config = base.get_config(argument, default_mode="clean")
    config.data.max_pairs = 8
    config.data.holdout_fraction = 0.25
    # One batch shape per split: a single compilation per step function and split.
    config.data.max_shapes = 1
    config.model.encoder = ""  # random_encoder: base's 2 layers, width 32
    config.model.tokenizer = "word_level:bert"
    config.model.tiered.update(dict(
        embedding_projection=16, state_projection=16, detector_layers=1, detector_heads=2,
        detector_ff=32))
    config.train.learning_rate = 1e-3
    config.train.batch_size = 2
    config.train.eval_batch_size = 2
    config.train.num_epochs = 2
    config.train.log_every_steps = 2
    config.train.checkpoint_every_steps = 2
    config.mesh.fsdp_min_size = 256
    return config
