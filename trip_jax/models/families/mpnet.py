"""MPNet (``model_type`` mpnet: microsoft/mpnet-base, all-mpnet-base-v2) in Flax linen, one unit.

BERT's post-norm layers plus one relative-attention table shared by all layers (32 buckets up to
distance 128, as Hugging Face's ``MPNetEncoder`` whatever the config says), positions from the
padding index 1 + 1, no token types, ``<s> a </s></s> b </s>``; names as ``MPNetModel``'s.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
from flax import linen as nn

from trip_jax.models import layer_stack
from trip_jax.encoder_registry import Capabilities, Checkpoint, Family
from trip_jax.models.families import bert, roberta
from trip_jax.models.families.bert import BertLayer, BertSelfAttention, _embed, _layer_norm
from trip_jax.models.relative_positions import RelativeAttentionBias
from trip_jax.models.segments import attention_bias, position_ids

# Hugging Face's MPNet hard-codes these: the padding index of both embeddings (positions count
# from it + 1) and the bucketing of the shared relative-attention table.
PADDING_INDEX = 1
NUM_BUCKETS = 32
MAX_DISTANCE = 128


def _check_config(config) -> None:
    """Refuses a config this encoder would read differently from Hugging Face's."""
    if config.relative_attention_num_buckets < NUM_BUCKETS:
        raise ValueError(f"relative_attention_num_buckets={config.relative_attention_num_buckets}:"
                         f" Hugging Face's MPNet looks up {NUM_BUCKETS} buckets")
    bert.check_config(config)


class MPNetAttention(layer_stack.Part):
    """``attn`` (q, k, v, the scaled logits plus the summed bias, o), dropout, then
    ``LayerNorm`` of the residual sum."""

    @nn.compact
    def __call__(self, x, bias, deterministic: bool):
        h = BertSelfAttention(self.config, self.dtype, ("q", "k", "v"), "o", name="attn")(
            x, bias, deterministic)
        h = nn.Dropout(self.config.hidden_dropout_prob)(h, deterministic=deterministic)
        return _layer_norm(self.config, self.dtype)(h + x)


class MPNetLayer(BertLayer):
    """BERT's layer with MPNet's attention (scanned: ``layer_stack``); ``(x, None)``."""

    attention_type = MPNetAttention


class MPNetTransformer(layer_stack.Stack):
    """Hugging Face's ``encoder``: the shared relative-attention table and the stacked layers."""

    @nn.compact
    def __call__(self, x, mask_bias, deterministic: bool):
        cfg = self.config
        bias = RelativeAttentionBias(
            cfg.relative_attention_num_buckets, cfg.num_attention_heads, NUM_BUCKETS,
            MAX_DISTANCE, cfg.initializer_range, name="relative_attention_bias")(x.shape[1])
        layers = layer_stack.scanned(MPNetLayer, length=cfg.num_hidden_layers, remat=self.remat,
                                     unroll=self.unroll)
        x, _ = layers(cfg, self.dtype, deterministic, name="layer")(
            x, bias + mask_bias)
        return x


class MPNetEncoder(layer_stack.Stack):
    """MPNet's encoder (``encoder_registry.Encoder``) of an MPNetConfig; token types
    ignored, positions restart at each packed row."""

    @nn.compact
    def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True,
                 segment_ids=None):
        cfg = self.config
        _check_config(cfg)
        words = _embed(cfg, cfg.vocab_size, self.dtype, "word_embeddings")
        positions = _embed(cfg, cfg.max_position_embeddings, self.dtype, "position_embeddings")
        x = words(input_ids)
        # nn.Embedding(padding_idx=1): the padding token's vector gets no gradient.
        x = jnp.where((input_ids == PADDING_INDEX)[..., None], jax.lax.stop_gradient(x), x)
        x = x + positions(position_ids(_PADDING, input_ids, segment_ids, offset=True))
        x = nn.Dropout(cfg.hidden_dropout_prob)(_layer_norm(cfg, self.dtype)(x),
                                                deterministic=deterministic)
        return MPNetTransformer(cfg, self.dtype, self.remat, self.unroll, name="encoder")(
            x, attention_bias(attention_mask, None, segment_ids), deterministic)


# position_ids reads the padding index from a config: Hugging Face's MPNet uses 1, whatever
# pad_token_id says.
_PADDING = types.SimpleNamespace(pad_token_id=PADDING_INDEX)


def convert(checkpoint: Checkpoint) -> Checkpoint:
    """Hugging Face's ``embeddings`` modules at the module's top, as here, under a base-model
    prefix (``mpnet.``: a masked-LM checkpoint) too."""
    out: Checkpoint = {}
    for path, value in checkpoint.items():
        k = path.index("embeddings") if "embeddings" in path[:2] else None
        if k is not None and path[k + 1:k + 2] in _EMBEDDINGS:
            path = path[:k] + path[k + 1:]
        out[path] = value
    return out


_EMBEDDINGS = (("word_embeddings",), ("position_embeddings",), ("LayerNorm",))


def random_config(values: dict) -> dict:
    """``model.random_encoder`` as MPNetConfig keywords (no token types; positions need the
    padding index and one more)."""
    keys = ("model_type", "vocab_size", "pad_token_id", "hidden_size", "num_hidden_layers",
            "num_attention_heads", "intermediate_size", "hidden_dropout_prob",
            "attention_probs_dropout_prob")
    return dict({k: values[k] for k in keys}, layer_norm_eps=1e-5,
                max_position_embeddings=values["max_position_embeddings"] + PADDING_INDEX + 1)


PUBLISHED = {
    "sentence-transformers/all-mpnet-base-v2": dict(vocab_size=30527, hidden_size=768,
        num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=514, layer_norm_eps=1e-05, pad_token_id=1, bos_token_id=0,
        eos_token_id=2),
}


# The tokenizer's conventions are RoBERTa's (<s>, <pad> = 1, </s>); the pooler is not used.
FAMILY = Family(name="mpnet", model_types=("mpnet",), build=MPNetEncoder, layers=bert.LAYERS,
                tokenizer=roberta.TOKENIZER, capabilities=Capabilities(token_types=False),
                position_offset=True, convert=convert, random_config=random_config,
                published=PUBLISHED)
