"""ModernBERT (``model_type`` modernbert) in Flax linen, as one family unit: rotary positions,
GeGLU, pre-norm layers alternating global and local (sliding-window) attention, no token types,
[CLS] a [SEP] b [SEP] with its own tokenizer's special tokens. Parameter names mirror the hub's
``ModernBertForMaskedLM`` checkpoints (``model/...``; layers stacked under ``model/layers``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from trip_jax.models import layer_stack
from trip_jax.models.activations import get_activation
from trip_jax.encoder_registry import (Capabilities, Checkpoint, Family, LayerLayout,
                                      TokenizerStyle)
from trip_jax.models.segments import attention_bias, segment_positions

_BASE = "model"
_TOP = ("embeddings", "layers", "final_norm")  # ModernBertModel's own modules


def _layer_norm(cfg, dtype, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=cfg.norm_eps, use_bias=cfg.norm_bias, dtype=dtype,
                        param_dtype=jnp.float32, name=name)


def _dense(cfg, features: int, std: float, bias: bool, dtype, name: str) -> nn.Dense:
    return nn.Dense(features, use_bias=bias, dtype=dtype, param_dtype=jnp.float32, name=name,
                    kernel_init=nn.initializers.truncated_normal(
                        std, lower=-cfg.initializer_cutoff_factor,
                        upper=cfg.initializer_cutoff_factor))


def _rope(cfg, kind: str, positions: jax.Array, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """cos, sin float32 [N, T, head_dim] of the rotary embedding of layer type ``kind``."""
    params = cfg.rope_parameters[kind]
    if params.get("rope_type", "default") != "default":
        raise NotImplementedError(f"rope_parameters[{kind!r}].rope_type="
                                  f"{params['rope_type']!r} (only 'default')")
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inverse = (1.0 / (params["rope_theta"] ** exponent)).astype(np.float32)
    angles = positions[..., None].astype(jnp.float32) * inverse
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    turned = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    x32 = x.astype(jnp.float32)
    return (x32 * cos[:, :, None] + turned.astype(jnp.float32) * sin[:, :, None]).astype(x.dtype)


class ModernBertAttention(layer_stack.Part):
    """Fused q/k/v projection, rotary positions, scaled attention over ``bias``, output."""

    @nn.compact
    def __call__(self, x, bias, cos, sin, deterministic: bool):
        cfg = self.config
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads
        out_std = cfg.initializer_range / (2.0 * cfg.num_hidden_layers) ** 0.5
        qkv = _dense(cfg, 3 * cfg.hidden_size, cfg.initializer_range, cfg.attention_bias,
                     self.dtype, "Wqkv")(x)
        qkv = qkv.reshape(qkv.shape[:-1] + (3, heads, head_dim))
        query, key, value = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
        query, key = _rotate(query, cos, sin), _rotate(key, cos, sin)
        logits = jnp.einsum("nqhd,nkhd->nhqk", query, key, preferred_element_type=jnp.float32)
        probs = jax.nn.softmax(logits * head_dim ** -0.5 + bias, axis=-1)
        probs = nn.Dropout(cfg.attention_dropout)(probs, deterministic=deterministic)
        out = jnp.einsum("nhqk,nkhd->nqhd", probs.astype(self.dtype), value)
        out = _dense(cfg, cfg.hidden_size, out_std, cfg.attention_bias, self.dtype, "Wo")(
            out.reshape(out.shape[:-2] + (cfg.hidden_size,)))
        return nn.Dropout(cfg.attention_dropout)(out, deterministic=deterministic)


class ModernBertMLP(layer_stack.Part):
    """GeGLU: Wi to twice the width, act(first half) * second half, dropout, Wo."""

    @nn.compact
    def __call__(self, x, deterministic: bool):
        cfg = self.config
        out_std = cfg.initializer_range / (2.0 * cfg.num_hidden_layers) ** 0.5
        h = _dense(cfg, 2 * cfg.intermediate_size, cfg.initializer_range, cfg.mlp_bias,
                   self.dtype, "Wi")(x)
        h = get_activation(cfg.hidden_activation)(h[..., :cfg.intermediate_size]) * h[
            ..., cfg.intermediate_size:]
        h = nn.Dropout(cfg.mlp_dropout)(h, deterministic=deterministic)
        return _dense(cfg, cfg.hidden_size, out_std, cfg.mlp_bias, self.dtype, "Wo")(h)


class ModernBertLayer(layer_stack.Layer):
    """One pre-norm layer (scanned: ``layer_stack``); returns ``(x, None)``. Layer 0 has no
    attention norm in Hugging Face's model: its ``attn_norm`` exists here for stacking and is
    skipped (``convert`` fills it)."""

    @nn.compact
    def __call__(self, x, biases, ropes, index, is_global):
        cfg = self.config
        pick = lambda pair: jax.tree.map(lambda g, l: jnp.where(is_global, g, l), *pair)
        bias, (cos, sin) = pick(biases), pick(ropes)
        normed = _layer_norm(cfg, self.dtype, "attn_norm")(x)
        h = jnp.where(index == 0, x.astype(normed.dtype), normed)
        x = x + ModernBertAttention(cfg, self.dtype, name="attn")(h, bias, cos, sin,
                                                                  self.deterministic)
        h = _layer_norm(cfg, self.dtype, "mlp_norm")(x)
        return x + ModernBertMLP(cfg, self.dtype, name="mlp")(h, self.deterministic), None


class ModernBertBody(layer_stack.Stack):
    """Hugging Face's ``ModernBertModel`` (named ``model`` as in its masked-LM checkpoints)."""

    @nn.compact
    def __call__(self, input_ids, attention_mask, deterministic: bool, segment_ids=None):
        cfg = self.config
        x = Embeddings(cfg, self.dtype, name="embeddings")(input_ids, deterministic)
        length = input_ids.shape[1]
        if segment_ids is None:
            positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), input_ids.shape)
        else:
            positions = segment_positions(segment_ids)
        full = attention_bias(attention_mask, None, segment_ids)
        offsets = np.arange(length)
        window = np.abs(offsets[:, None] - offsets[None, :]) <= cfg.sliding_window
        local = jnp.where(window, full, jnp.finfo(jnp.float32).min)
        full = jnp.broadcast_to(full, local.shape)
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        ropes = (_rope(cfg, "full_attention", positions, head_dim),
                 _rope(cfg, "sliding_attention", positions, head_dim))
        kinds = list(cfg.layer_types)
        if set(kinds) - {"full_attention", "sliding_attention"}:
            raise NotImplementedError(f"layer_types {sorted(set(kinds))}: only full_attention "
                                      f"and sliding_attention")
        layers = layer_stack.scanned(
            ModernBertLayer, length=cfg.num_hidden_layers, remat=self.remat, unroll=self.unroll,
            in_axes=(nn.broadcast, nn.broadcast, 0, 0))
        x, _ = layers(cfg, self.dtype, deterministic, name="layers")(
            x, (full, local), ropes, jnp.arange(len(kinds)),
            jnp.asarray([k == "full_attention" for k in kinds]))
        return _layer_norm(cfg, self.dtype, "final_norm")(x)


class Embeddings(layer_stack.Part):
    """Hugging Face's ``embeddings``: the token embedding (``tok_embeddings``), norm, dropout;
    the padding token's vector gets no gradient (torch's ``padding_idx``)."""

    @nn.compact
    def __call__(self, input_ids, deterministic: bool):
        cfg = self.config
        x = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=self.dtype, param_dtype=jnp.float32,
                     name="tok_embeddings", embedding_init=nn.initializers.truncated_normal(
                         cfg.initializer_range))(input_ids)
        pad = getattr(cfg, "pad_token_id", None)
        if pad is not None:
            x = jnp.where((input_ids == pad)[..., None], jax.lax.stop_gradient(x), x)
        x = _layer_norm(cfg, self.dtype, "norm")(x)
        return nn.Dropout(cfg.embedding_dropout)(x, deterministic=deterministic)


class ModernBertEncoder(layer_stack.Stack):
    """ModernBERT (``encoder_registry.Encoder``); token types ignored, a packed row's rotary
    positions from 0 and its local layers' window within it."""

    @nn.compact
    def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True,
                 segment_ids=None):
        return ModernBertBody(self.config, self.dtype, self.remat, self.unroll, name=_BASE)(
            input_ids, attention_mask, deterministic, segment_ids)


def convert(checkpoint: Checkpoint) -> Checkpoint:
    """A ``ModernBertModel`` file's keys under ``model.`` (the masked-LM layout), and layer 0's
    absent attention norm as ones (its bias as zeros), shaped as layer 0's MLP norm."""
    bare = not any(path[0] == _BASE for path in checkpoint)
    out = {((_BASE,) + path if bare and path[0] in _TOP else path): value
           for path, value in checkpoint.items()}
    layer0 = (_BASE, "layers", "0")
    for leaf, fill in (("weight", np.ones_like), ("bias", np.zeros_like)):
        source = layer0 + ("mlp_norm", leaf)
        if source in out:
            out.setdefault(layer0 + ("attn_norm", leaf), fill(out[source]))
    return out


def random_config(values: dict) -> dict:
    """``model.random_encoder`` as ModernBertConfig keywords (the dropouts mapped; a global
    layer every third as ModernBERT's own)."""
    out = {k: values[k] for k in ("model_type", "vocab_size", "pad_token_id", "hidden_size",
                                  "num_hidden_layers", "num_attention_heads",
                                  "intermediate_size", "max_position_embeddings")}
    return dict(out, embedding_dropout=values["hidden_dropout_prob"],
                mlp_dropout=values["hidden_dropout_prob"],
                attention_dropout=values["attention_probs_dropout_prob"],
                bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)


# ModernBERT's tokenizer: BERT's special tokens in its own id order, no token types.
TOKENIZER = TokenizerStyle(
    name="modernbert",
    special_tokens={"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "pad_token": "[PAD]", "mask_token": "[MASK]"},
    cls="[CLS]", sep="[SEP]", single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
    token_types=False)


PUBLISHED = {
    "answerdotai/ModernBERT-large": dict(vocab_size=50368, hidden_size=1024,
        intermediate_size=2624, num_hidden_layers=28, num_attention_heads=16,
        global_attn_every_n_layers=3, local_attention=128, max_position_embeddings=8192,
        pad_token_id=50283, bos_token_id=50281, eos_token_id=50282, cls_token_id=50281,
        sep_token_id=50282),
}


FAMILY = Family(
    name="modernbert", model_types=("modernbert",), build=ModernBertEncoder,
    layers=LayerLayout(stacked=(_BASE, "layers"), per_layer=(_BASE, "layers", "{}")),
    tokenizer=TOKENIZER, capabilities=Capabilities(token_types=False), convert=convert,
    pooled="the row's first token ([CLS])", random_config=random_config, published=PUBLISHED,
    gated=lambda hf_config: True)  # its MLP is a GLU
