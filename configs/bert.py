r"""BERT-large (uncased) tiered model, the paper's best loss configuration.

Command (needs the bert-large-uncased weights from the Hugging Face hub or a local directory
given with --config.model.encoder=DIR, and a GPU/TPU):

  python -m trip_jax.main --config=configs/bert.py --workdir=workdirs/bert

With the full release (protocol "standard"), the paper reports on test 70.9 / 21.9 / 8.3
(accuracy / consistency / verifiability, %). Expected result of this code: not yet measured.

Runs the exact reference mode by default: the original implementation's step, padding cells,
unmasked losses, entity padding, zero token types, transformers.AdamW and the 16-token cut
included (docs/exact-mode.md). ``:clean`` gives the cleaned-up variant instead (padding masked
out of the detector and the losses, entities bucketed per batch, segment token types, optax
AdamW, no cut); a loss preset combines with either (``:clean,all``, ``:exact,omit_states``).
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the BERT-large configuration (argument: mode and/or Table 2 loss preset,
    configs/base.py; default mode exact)."""
    config = base.get_config(argument, default_mode="exact")
    config.model.encoder = "bert-large-uncased"
    config.train.learning_rate = 5e-5
    return config
