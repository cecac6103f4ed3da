r"""RoBERTa-large tiered model, the paper's best configuration (no story-choice loss), exact mode.

Command (roberta-large from the hub or ``--config.model.encoder=DIR``; a GPU/TPU):
``python -m trip_jax.main --config=configs/roberta.py --workdir=workdirs/roberta``. Expected:
the paper reports test 72.9 / 19.1 / 9.1 (acc. / cons. / verif., %); this code's: not yet run.
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the RoBERTa-large configuration (argument: mode and/or Table 2 loss preset,
    configs/base.py; default mode exact)."""
    config = base.get_config(argument, default_mode="exact")
    config.model.encoder = "roberta-large"
    config.train.learning_rate = 1e-5
    return config
