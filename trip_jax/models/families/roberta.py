"""RoBERTa (``model_type`` roberta): BERT's encoder with positions counted from pad_id + 1,
<s> a </s></s> b </s>, no token types."""

from __future__ import annotations

import functools

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

PUBLISHED = {
    "roberta-large": dict(vocab_size=50265, hidden_size=1024, num_hidden_layers=24,
        num_attention_heads=16, intermediate_size=4096, max_position_embeddings=514,
        type_vocab_size=1, layer_norm_eps=1e-05, pad_token_id=1, bos_token_id=0, eos_token_id=2),
}


FAMILY = Family(name="roberta", model_types=("roberta",),
                build=functools.partial(BertEncoder, position_offset=True), layers=bert.LAYERS,
                tokenizer=TOKENIZER, capabilities=Capabilities(mask_bias=True),
                position_offset=True, published=PUBLISHED)
