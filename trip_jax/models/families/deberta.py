"""DeBERTa v1 and v2/v3 (``model_type`` deberta, deberta-v2):
``trip_jax.models.deberta.DebertaEncoder``, BERT's tokenizer template."""

from __future__ import annotations

from trip_jax.models.contract import Family
from trip_jax.models.deberta import DebertaEncoder
from trip_jax.models.families import bert


def build(hf_config, **options) -> DebertaEncoder:
    """The encoder (options: dtype, remat, unroll)."""
    return DebertaEncoder(config=hf_config, **options)


# Checkpoints ship position_embeddings even when position_biased_input is false (then the
# model has none; with it true they load as usual), as Hugging Face's
# _keys_to_ignore_on_load_unexpected.
FAMILY = Family(name="deberta", model_types=("deberta", "deberta-v2"), build=build,
                layers=bert.LAYERS, tokenizer=bert.TOKENIZER,
                ignore_unexpected=("position_embeddings",))
