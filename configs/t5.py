r"""Flan-T5-large's encoder in the tiered model at exact fidelity, the paper's recipe otherwise.

Command (google/flan-t5-large from the hub or ``--config.model.encoder=DIR``; a GPU/TPU):
``python -m trip_jax.main --config=configs/t5.py --workdir=workdirs/t5``. Expected: no paper
result (T5 is Breakpoint Transformers' encoder, not the paper's); this code's: not yet run.
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the Flan-T5-large configuration (argument: fidelity, recipe and/or losses,
    configs/base.py; default fidelity exact, recipe paper). A row is read at its first token
    (T5 has no [CLS]); the padding row is masked as T5 masks (no transformers 4.11 bias); the
    learning rate is the paper's for its large encoder (RoBERTa-large)."""
    config = base.get_config(argument, default_fidelity="exact")
    config.model.encoder = "google/flan-t5-large"
    config.train.learning_rate = 1e-5
    config.model.tiered.padding_row_attention = "masked"
    return config
