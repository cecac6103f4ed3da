r"""DeBERTa-base tiered model, the paper's best loss configuration.

Command (needs the microsoft/deberta-base weights from the Hugging Face hub or a local directory
given with --config.model.encoder=DIR, and a GPU/TPU):

  python -m trip_jax.main --config=configs/deberta.py --workdir=workdirs/deberta

With the full release (protocol "standard"), the paper reports on test 72.9 / 22.2 / 6.6
(accuracy / consistency / verifiability, %). Expected result of this code: not yet measured.
"""

from configs import base


def get_config(loss_preset: str | None = None):
    """Returns the DeBERTa-base configuration (argument: a Table 2 loss preset)."""
    config = base.get_config(loss_preset)
    config.model.encoder = "microsoft/deberta-base"
    config.train.learning_rate = 5e-5
    return config
