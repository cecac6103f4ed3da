r"""RoBERTa-large tiered model at exact fidelity: the paper's best configuration (no story loss).

Command (roberta-large from the hub or ``--config.model.encoder=DIR``; a GPU/TPU):
``python -m trip_jax.main --config=configs/roberta.py --workdir=workdirs/roberta``. Expected:
the paper reports test 72.9 / 19.1 / 9.1 (acc. / cons. / verif., %); this code's: not yet run.
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the RoBERTa-large configuration (argument: fidelity, recipe and/or losses,
    configs/base.py; default fidelity exact, recipe paper)."""
    config = base.get_config(argument, default_fidelity="exact")
    config.model.encoder = "roberta-large"
    config.train.learning_rate = 1e-5
    return config
