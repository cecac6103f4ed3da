r"""A tiny random model on a few pairs: the whole loop in seconds on CPU (tests, smoke runs).

Command: ``python -m trip_jax.main --config=configs/tiny.py --workdir=/tmp/trip_tiny``.
Expected result: a finished run with reports/test.md, scores of an untrained model (near the
random baseline) that mean nothing. ``:fidelity=exact`` runs it at exact fidelity.
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the tiny configuration (argument: fidelity, recipe and/or losses,
    configs/base.py; default fidelity clean, recipe paper)."""
    config = base.get_config(argument, default_fidelity="clean")
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
