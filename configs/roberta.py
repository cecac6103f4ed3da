r"""RoBERTa-large tiered model, the paper's best configuration (no story-choice loss).

Command (needs the roberta-large weights from the Hugging Face hub or a local directory given
with --config.model.encoder=DIR, and a GPU/TPU: a step takes seconds on CPU):

  python -m trip_jax.main --config=configs/roberta.py --workdir=workdirs/roberta

With the full release (train split: protocol "standard"), the paper reports on test 72.9 / 19.1 /
9.1 (accuracy / consistency / verifiability, %). Expected result of this code: not yet measured.
Other rows of Table 2: configs/roberta.py:all, :omit_conflict, :omit_states.

Runs the exact reference mode by default: the original implementation's step, padding cells,
unmasked losses, entity padding, zero token types, transformers.AdamW and the 16-token cut
included (docs/exact-mode.md). ``:clean`` gives the cleaned-up variant instead (padding masked
out of the detector and the losses, entities bucketed per batch, segment token types, optax
AdamW, no cut); a loss preset combines with either (``:clean,all``, ``:exact,omit_states``).
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the RoBERTa-large configuration (argument: mode and/or Table 2 loss preset,
    configs/base.py; default mode exact)."""
    config = base.get_config(argument, default_mode="exact")
    config.model.encoder = "roberta-large"
    config.train.learning_rate = 1e-5
    return config
