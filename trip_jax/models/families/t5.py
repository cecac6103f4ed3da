"""T5's encoder (``model_type`` t5: T5 v1.0, v1.1 and Flan-T5) in Flax linen, as one family unit.

RMS norms, relative-attention buckets (one table, Hugging Face's block 0's), the dense or gated
feed-forward; no token types, no [CLS]: a row is read at its first token. Parameter names mirror
``T5EncoderModel``'s (layers stacked under ``encoder/block``); ``a </s> b </s>``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from trip_jax.models import layer_stack
from trip_jax.models.activations import get_activation
from trip_jax.encoder_registry import (Capabilities, Checkpoint, Family, LayerLayout,
                                      TokenizerStyle)
from trip_jax.models.segments import attention_bias
from trip_jax.models.relative_positions import RelativeAttentionBias

# Hugging Face keeps the one relative-attention table in block 0; here it is the stack's own.
_TABLE_IN_BLOCK_0 = ("encoder", "block", "0", "layer", "0", "SelfAttention",
                     "relative_attention_bias")
_TABLE = ("encoder", "relative_attention_bias")


def _dense(features: int, std: float, dtype, name: str) -> nn.Dense:
    return nn.Dense(features, use_bias=False, dtype=dtype, param_dtype=jnp.float32, name=name,
                    kernel_init=nn.initializers.normal(std))


class RMSNorm(nn.Module):
    """T5's layer norm: scale only, no mean, computed in float32."""

    epsilon: float
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.epsilon)
        return (scale * x32).astype(self.dtype)


class T5SelfAttention(layer_stack.Part):
    """Unscaled multi-head attention (q, k, v, o without bias) over the summed bias."""

    @nn.compact
    def __call__(self, x, bias, deterministic: bool):
        cfg = self.config
        heads, head_dim, factor = cfg.num_heads, cfg.d_kv, cfg.initializer_factor
        inner = heads * head_dim
        split = lambda h: h.reshape(h.shape[:-1] + (heads, head_dim))
        query = split(_dense(inner, factor * (cfg.d_model * head_dim) ** -0.5, self.dtype,
                             "q")(x))
        key = split(_dense(inner, factor * cfg.d_model ** -0.5, self.dtype, "k")(x))
        value = split(_dense(inner, factor * cfg.d_model ** -0.5, self.dtype, "v")(x))
        logits = jnp.einsum("nqhd,nkhd->nhqk", query, key, preferred_element_type=jnp.float32)
        probs = jax.nn.softmax(logits + bias, axis=-1)
        probs = nn.Dropout(cfg.dropout_rate)(probs, deterministic=deterministic)
        out = jnp.einsum("nhqk,nkhd->nqhd", probs.astype(self.dtype), value)
        return _dense(cfg.d_model, factor * inner ** -0.5, self.dtype, "o")(
            out.reshape(out.shape[:-2] + (inner,)))


class T5FeedForward(layer_stack.Part):
    """Hugging Face's DenseReluDense: wi -> act -> wo, or (gated) act(wi_0) * wi_1 -> wo."""

    @nn.compact
    def __call__(self, x, deterministic: bool):
        cfg = self.config
        std_in = cfg.initializer_factor * cfg.d_model ** -0.5
        act = get_activation(cfg.dense_act_fn)
        if cfg.is_gated_act:
            h = (act(_dense(cfg.d_ff, std_in, self.dtype, "wi_0")(x))
                 * _dense(cfg.d_ff, std_in, self.dtype, "wi_1")(x))
        else:
            h = act(_dense(cfg.d_ff, std_in, self.dtype, "wi")(x))
        h = nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
        return _dense(cfg.d_model, cfg.initializer_factor * cfg.d_ff ** -0.5, self.dtype,
                      "wo")(h)


class T5Sublayers(layer_stack.Layer):
    """Hugging Face's ``block.{i}.layer``: 0 the self-attention, 1 the feed-forward, each
    pre-normed with a residual."""

    @nn.compact
    def __call__(self, x, bias):
        cfg, det = self.config, self.deterministic
        drop = lambda h: nn.Dropout(cfg.dropout_rate)(h, deterministic=det)
        attention = _Sublayer(cfg, self.dtype, "SelfAttention", name="0")
        x = x + drop(attention(x, bias, det))
        return x + drop(_Sublayer(cfg, self.dtype, "DenseReluDense", name="1")(x, None, det))


class _Sublayer(nn.Module):
    """``layer_norm`` then ``SelfAttention`` or ``DenseReluDense`` (``kind``)."""

    config: Any
    dtype: Any
    kind: str

    @nn.compact
    def __call__(self, x, bias, deterministic: bool):
        h = RMSNorm(self.config.layer_norm_epsilon, self.dtype, name="layer_norm")(x)
        if self.kind == "SelfAttention":
            return T5SelfAttention(self.config, self.dtype, name=self.kind)(h, bias,
                                                                           deterministic)
        return T5FeedForward(self.config, self.dtype, name=self.kind)(h, deterministic)


class T5Block(layer_stack.Layer):
    """One block (scanned: ``layer_stack``); returns ``(x, None)``."""

    @nn.compact
    def __call__(self, x, bias):
        return T5Sublayers(self.config, self.dtype, self.deterministic, name="layer")(x, bias), None


class T5Stack(layer_stack.Stack):
    """Hugging Face's ``encoder``: the relative-attention table, the blocks, the final norm."""

    @nn.compact
    def __call__(self, x, mask_bias, deterministic: bool):
        cfg = self.config
        buckets = cfg.relative_attention_num_buckets
        bias = RelativeAttentionBias(
            buckets, cfg.num_heads, buckets, cfg.relative_attention_max_distance,
            cfg.initializer_factor * cfg.d_model ** -0.5, name="relative_attention_bias")(
            x.shape[1]) + mask_bias
        layers = layer_stack.scanned(T5Block, length=cfg.num_layers, remat=self.remat,
                                     unroll=self.unroll)
        x, _ = layers(cfg, self.dtype, deterministic, name="block")(x, bias)
        x = RMSNorm(cfg.layer_norm_epsilon, self.dtype, name="final_layer_norm")(x)
        return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)


class T5Encoder(layer_stack.Stack):
    """T5's encoder (``encoder_registry.Encoder``) of a T5Config; token types ignored, a
    packed row's relative positions its own (``segments.attention_bias``)."""

    @nn.compact
    def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True,
                 segment_ids=None):
        cfg = self.config
        if getattr(cfg, "is_decoder", False):
            raise NotImplementedError("a T5 decoder config is not an encoder")
        x = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=self.dtype, param_dtype=jnp.float32,
                     embedding_init=nn.initializers.normal(cfg.initializer_factor),
                     name="shared")(input_ids)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        return T5Stack(cfg, self.dtype, self.remat, self.unroll, name="encoder")(
            x, attention_bias(attention_mask, None, segment_ids), deterministic)


def convert(checkpoint: Checkpoint) -> Checkpoint:
    """Block 0's relative-attention table to the stack's; ``encoder.embed_tokens`` (tied to
    ``shared``) as ``shared`` where the file lacks it. Keys with a base-model prefix too."""
    out: Checkpoint = {}
    for path, value in checkpoint.items():
        for k in range(len(path)):
            if path[k:k + len(_TABLE_IN_BLOCK_0)] == _TABLE_IN_BLOCK_0:
                path = path[:k] + _TABLE + path[k + len(_TABLE_IN_BLOCK_0):]
                break
        out[path] = value
    for path in [p for p in out if p[-3:] == ("encoder", "embed_tokens", "weight")]:
        shared = path[:-3] + ("shared", "weight")
        value = out.pop(path)
        out.setdefault(shared, value)
    return out


def random_config(values: dict) -> dict:
    """``model.random_encoder`` as a Flan-T5-style (gated GELU) T5Config's keywords."""
    heads = values["num_attention_heads"]
    return dict(model_type="t5", vocab_size=values["vocab_size"],
                pad_token_id=values["pad_token_id"], d_model=values["hidden_size"],
                num_layers=values["num_hidden_layers"], num_heads=heads,
                d_kv=values["hidden_size"] // heads, d_ff=values["intermediate_size"],
                dropout_rate=values["hidden_dropout_prob"], feed_forward_proj="gated-gelu",
                decoder_start_token_id=values["pad_token_id"])


TOKENIZER = TokenizerStyle(
    name="t5", special_tokens={"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"},
    cls=None, sep="</s>", single="$A </s>", pair="$A </s> $B </s>", token_types=False)


PUBLISHED = {
    "google/flan-t5-large": dict(vocab_size=32128, d_model=1024, d_kv=64, d_ff=2816,
        num_layers=24, num_heads=16, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),
}


FAMILY = Family(
    name="t5", model_types=("t5",), build=T5Encoder,
    layers=LayerLayout(stacked=("encoder", "block"), per_layer=("encoder", "block", "{}")),
    tokenizer=TOKENIZER, capabilities=Capabilities(token_types=False), convert=convert,
    pooled="the row's first token (the entity's first piece: T5 has no [CLS])",
    random_config=random_config, published=PUBLISHED,
    gated=lambda hf_config: hf_config.is_gated_act)
