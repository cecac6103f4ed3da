r"""BERT-large (uncased) tiered model, the paper's best loss configuration, exact fidelity.

Command (bert-large-uncased from the hub or ``--config.model.encoder=DIR``, a GPU/TPU):
``python -m trip_jax.main --config=configs/bert.py --workdir=workdirs/bert``. Expected result:
the paper reports test 70.9 / 21.9 / 8.3 (acc. / cons. / verif., %); this code's: not yet run.
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the BERT-large configuration (argument: fidelity, recipe and/or losses,
    configs/base.py; default fidelity exact, recipe paper)."""
    config = base.get_config(argument, default_fidelity="exact")
    config.model.encoder = "bert-large-uncased"
    config.train.learning_rate = 5e-5
    return config
