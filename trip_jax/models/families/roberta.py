"""RoBERTa (``model_type`` roberta): BERT's encoder with positions counted from pad_id + 1,
<s> a </s></s> b </s>, no token types."""

from __future__ import annotations

from trip_jax.encoder_registry import Capabilities, Family, TokenizerStyle
from trip_jax.models.families import bert
from trip_jax.models.families.bert import BertEncoder

# In id order, as in the real roberta vocabulary.
TOKENIZER = TokenizerStyle(
    name="roberta",
    special_tokens={"cls_token": "<s>", "pad_token": "<pad>", "sep_token": "</s>",
                    "unk_token": "<unk>", "mask_token": "<mask>"},
    cls="<s>", sep="</s>", single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
    token_types=False)


def build(hf_config, **options) -> BertEncoder:
    """The encoder (options: dtype, remat, unroll), positions after the padding id."""
    return BertEncoder(config=hf_config, position_offset=FAMILY.position_offset, **options)


FAMILY = Family(name="roberta", model_types=("roberta",), build=build, layers=bert.LAYERS,
                tokenizer=TOKENIZER, capabilities=Capabilities(mask_bias=True),
                position_offset=True)
