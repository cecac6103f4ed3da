r"""ModernBERT-large in the tiered model at exact fidelity, the paper's recipe otherwise.

Command (answerdotai/ModernBERT-large from the hub or ``--config.model.encoder=DIR``; a GPU/TPU):
``python -m trip_jax.main --config=configs/modernbert.py --workdir=workdirs/modernbert``.
Expected: no paper result (ModernBERT postdates the paper); this code's: not yet run.
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the ModernBERT-large configuration (argument: fidelity, recipe and/or losses,
    configs/base.py; default fidelity exact, recipe paper). The padding row is masked as
    ModernBERT masks (no transformers 4.11 bias); the learning rate is the paper's for its
    large encoder (RoBERTa-large)."""
    config = base.get_config(argument, default_fidelity="exact")
    config.model.encoder = "answerdotai/ModernBERT-large"
    config.train.learning_rate = 1e-5
    config.model.tiered.padding_row_attention = "masked"
    return config
