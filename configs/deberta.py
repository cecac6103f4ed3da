r"""DeBERTa-base tiered model at exact fidelity (docs/fidelity.md), the paper's best loss weights.

Command (microsoft/deberta-base from the hub or ``--config.model.encoder=DIR``; a GPU/TPU):
``python -m trip_jax.main --config=configs/deberta.py --workdir=workdirs/deberta``. Expected:
the paper reports test 72.9 / 22.2 / 6.6 (acc. / cons. / verif., %); this code's: not yet run.
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the DeBERTa-base configuration (argument: fidelity, recipe and/or losses,
    configs/base.py; default fidelity exact, recipe paper)."""
    config = base.get_config(argument, default_fidelity="exact")
    config.model.encoder = "microsoft/deberta-base"
    config.train.learning_rate = 5e-5
    config.model.tiered.padding_row_attention = "masked"
    return config
