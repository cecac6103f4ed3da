"""BERT (``model_type`` bert): ``trip_jax.models.bert.BertEncoder``, [CLS] a [SEP] b [SEP]."""

from __future__ import annotations

from trip_jax.models.bert import BertEncoder
from trip_jax.models.contract import Capabilities, Family, LayerLayout, TokenizerStyle

TOKENIZER = TokenizerStyle(
    name="bert",
    special_tokens={"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                    "sep_token": "[SEP]", "mask_token": "[MASK]"},
    cls="[CLS]", sep="[SEP]", single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
    token_types=True)
# Hugging Face's encoder.layer.{i}, stacked here as encoder/layer.
LAYERS = LayerLayout(stacked=("encoder", "layer"), per_layer=("encoder", "layer", "{}"))


def build(hf_config, **options) -> BertEncoder:
    """The encoder (options: dtype, remat, unroll)."""
    return BertEncoder(config=hf_config, **options)


FAMILY = Family(name="bert", model_types=("bert",), build=build, layers=LAYERS,
                tokenizer=TOKENIZER, capabilities=Capabilities(mask_bias=True))
