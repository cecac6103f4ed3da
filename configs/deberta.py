r"""DeBERTa-base tiered model, the paper's best loss configuration.

Command (needs the microsoft/deberta-base weights from the Hugging Face hub or a local directory
given with --config.model.encoder=DIR, and a GPU/TPU):

  python -m trip_jax.main --config=configs/deberta.py --workdir=workdirs/deberta

With the full release (protocol "standard"), the paper reports on test 72.9 / 22.2 / 6.6
(accuracy / consistency / verifiability, %). Expected result of this code: not yet measured.

Runs the exact reference mode by default: the original implementation's step, padding cells,
unmasked losses, entity padding, zero token types, transformers.AdamW and the 16-token cut
included (docs/exact-mode.md). ``:clean`` gives the cleaned-up variant instead (padding masked
out of the detector and the losses, entities bucketed per batch, segment token types, optax
AdamW, no cut); a loss preset combines with either (``:clean,all``, ``:exact,omit_states``).

DeBERTa masks a fully masked row its own way (not the additive mask of transformers 4.11's BERT
and RoBERTa), so the exact mode's padding row is masked as the encoder masks any row
(model.tiered.padding_row_attention="masked"); docs/exact-mode.md says how far that is checked.
"""

from configs import base


def get_config(argument: str | None = None):
    """Returns the DeBERTa-base configuration (argument: mode and/or Table 2 loss preset,
    configs/base.py; default mode exact)."""
    config = base.get_config(argument, default_mode="exact")
    config.model.encoder = "microsoft/deberta-base"
    config.train.learning_rate = 5e-5
    config.model.tiered.padding_row_attention = "masked"
    return config
