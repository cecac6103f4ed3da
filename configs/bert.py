r"""BERT-large (uncased) tiered model, the paper's best loss configuration.

Command (needs the bert-large-uncased weights from the Hugging Face hub or a local directory
given with --config.model.encoder=DIR, and a GPU/TPU):

  python -m trip_jax.main --config=configs/bert.py --workdir=workdirs/bert

With the full release (protocol "standard"), the paper reports on test 70.9 / 21.9 / 8.3
(accuracy / consistency / verifiability, %). Expected result of this code: not yet measured.
"""

from configs import base


def get_config(loss_preset: str | None = None):
    """Returns the BERT-large configuration (argument: a Table 2 loss preset)."""
    config = base.get_config(loss_preset)
    config.model.encoder = "bert-large-uncased"
    config.train.learning_rate = 5e-5
    return config
