"""DeBERTa (v1) and DeBERTa-v2/v3 (``model_type`` deberta, deberta-v2) in Flax linen, one unit.

``DebertaEncoder(config)`` maps ids, attention mask and token types [N, T] to the last hidden
states [N, T, H]; ``config.model_type`` picks the variant, parameter paths mirror the torch
modules (layers stacked). Packing: docs/reference.md#hand-written-parts-and-why.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from trip_jax.models import layer_stack
from trip_jax.models.activations import get_activation
from trip_jax.encoder_registry import Family
from trip_jax.models.families import bert
from trip_jax.models.segments import segment_attention_mask, segment_positions


def _is_v2(config) -> bool:
    return config.model_type == "deberta-v2"


def _max_relative_positions(config) -> int:
    mrp = getattr(config, "max_relative_positions", -1)
    return mrp if mrp >= 1 else config.max_position_embeddings


def _position_buckets(config) -> int:
    # Log-bucketing only exists in v2/v3.
    return getattr(config, "position_buckets", -1) if _is_v2(config) else -1


def _rel_embedding_rows(config) -> int:
    """Rows of ``encoder/rel_embeddings`` (twice the attention span)."""
    buckets = _position_buckets(config)
    return 2 * (buckets if buckets > 0 else _max_relative_positions(config))


def make_log_bucket_position(relative_pos: np.ndarray, bucket_size: int,
                             max_position: int) -> np.ndarray:
    """DeBERTa-v2's log buckets: distances beyond ``bucket_size // 2`` grow logarithmically.

    Evaluated in float32 like transformers so bucket boundaries agree exactly.
    """
    rel = np.asarray(relative_pos, dtype=np.int64)
    mid = bucket_size // 2
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel)).astype(np.float32)
    ratio = np.log(abs_pos / np.float32(mid)) / np.log(np.float32((max_position - 1) / mid))
    log_pos = np.ceil(ratio * np.float32(mid - 1)) + np.float32(mid)
    bucket = np.where(abs_pos <= mid, rel.astype(np.float32), log_pos * np.sign(rel))
    return bucket.astype(np.int64)


def relative_layout(config, seq_len: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """The disentangled attention's static gather plan at length ``seq_len``: ``(lo, hi,
    c2p_index, p2c_index)``; only table rows ``lo..hi`` are read (and projected), the indices
    [q, k] and [k, q] (transformers' clamped ones) point into that slice. The row read for a
    distance does not depend on ``seq_len`` (docs/reference.md#hand-written-parts-and-why)."""
    ids = np.arange(seq_len)
    rel = ids[:, None] - ids[None, :]  # query i to key j, log-bucketed for v2
    if _position_buckets(config) > 0:
        rel = make_log_bucket_position(rel, _position_buckets(config),
                                       _max_relative_positions(config))
    if _is_v2(config):
        span, offset = _rel_embedding_rows(config) // 2, 0
    else:  # v1 reads rows [mrp - span, mrp + span) with span = min(T, mrp)
        mrp = _max_relative_positions(config)
        span = min(seq_len, mrp)
        offset = mrp - span
    c2p = np.clip(rel + span, 0, 2 * span - 1) + offset
    # Rows of this matrix are keys and columns queries (transformers gathers then transposes).
    p2c = np.clip(-rel + span, 0, 2 * span - 1) + offset
    used = [idx for kind, idx in (("c2p", c2p), ("p2c", p2c))
            if kind in (config.pos_att_type or [])]
    if not used:
        return 0, -1, c2p, p2c
    lo = int(min(idx.min() for idx in used))
    hi = int(max(idx.max() for idx in used))
    return lo, hi, c2p - lo, p2c - lo


def _layer_norm(config, dtype, name: str = "LayerNorm") -> nn.LayerNorm:
    # Two-pass variance, epsilon inside the square root: same as DebertaLayerNorm / torch.
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=dtype, use_fast_variance=False,
                        name=name)


def _gather_last(logits: jnp.ndarray, index: np.ndarray) -> jnp.ndarray:
    """logits [N, H, A, R] gathered along R by a static index [A, B] -> [N, H, A, B]."""
    full = jnp.broadcast_to(jnp.asarray(index, jnp.int32), logits.shape[:2] + index.shape)
    return jnp.take_along_axis(logits, full, axis=-1)


class DebertaEmbeddings(layer_stack.Part):
    """Word (+ absolute position) (+ token type) embeddings, LayerNorm, padding zeroed."""

    @nn.compact
    def __call__(self, input_ids, token_type_ids, mask, deterministic: bool, segment_ids=None):
        """Embeddings [N, T, H], zero where ``mask`` [N, T] is; positions restart at each
        packed row."""
        cfg = self.config
        emb_size = getattr(cfg, "embedding_size", cfg.hidden_size)
        x = nn.Embed(cfg.vocab_size, emb_size, dtype=self.dtype,
                     name="word_embeddings")(input_ids)
        if getattr(cfg, "position_biased_input", True):
            seq_len = input_ids.shape[1]
            if seq_len > cfg.max_position_embeddings:
                raise ValueError(f"sequence length {seq_len} exceeds max_position_embeddings="
                                 f"{cfg.max_position_embeddings}")
            positions = (jnp.arange(seq_len)[None, :] if segment_ids is None
                         else segment_positions(segment_ids))
            x = x + nn.Embed(cfg.max_position_embeddings, emb_size, dtype=self.dtype,
                             name="position_embeddings")(positions)
        if cfg.type_vocab_size > 0:
            x = x + nn.Embed(cfg.type_vocab_size, emb_size, dtype=self.dtype,
                             name="token_type_embeddings")(token_type_ids)
        if emb_size != cfg.hidden_size:
            x = nn.Dense(cfg.hidden_size, use_bias=False, dtype=self.dtype, name="embed_proj")(x)
        x = _layer_norm(cfg, self.dtype)(x)
        x = x * mask[..., None].astype(x.dtype)
        return nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)


class DisentangledSelfAttention(layer_stack.Part):
    """Attention logits: content-to-content plus content-to-position (c2p) and position-to-content
    (p2c)."""

    def _dense(self, features: int, name: str, use_bias: bool = True) -> nn.Dense:
        return nn.Dense(features, use_bias=use_bias, dtype=self.dtype, name=name)

    @nn.compact
    def __call__(self, hidden, pair_mask, rel_embeddings, deterministic: bool):
        """hidden [N, T, H], pair_mask bool [N, 1, T, T], rel_embeddings: the table rows that
        ``relative_layout`` says are used (or None) -> context [N, T, heads * head_dim]."""
        cfg, v2 = self.config, _is_v2(self.config)
        batch, seq_len, _ = hidden.shape
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "attention_head_size", cfg.hidden_size // heads) if v2 else (
            cfg.hidden_size // heads)
        width = heads * head_dim
        types = list(cfg.pos_att_type or [])
        split_heads = lambda x: x.reshape(x.shape[:-1] + (heads, head_dim))

        if v2:
            query_proj = self._dense(width, "query_proj")
            key_proj = self._dense(width, "key_proj")
            query = split_heads(query_proj(hidden))
            key = split_heads(key_proj(hidden))
            value = split_heads(self._dense(width, "value_proj")(hidden))
        else:  # one fused projection, laid out per head as [q | k | v]
            qkv = self._dense(3 * width, "in_proj", use_bias=False)(hidden)
            query, key, value = jnp.split(qkv.reshape(qkv.shape[:-1] + (heads, 3 * head_dim)),
                                          3, axis=-1)
            q_bias = self.param("q_bias", nn.initializers.zeros, (width,))
            v_bias = self.param("v_bias", nn.initializers.zeros, (width,))
            query = query + split_heads(q_bias.astype(self.dtype))
            value = value + split_heads(v_bias.astype(self.dtype))

        # v1 counts every entry of pos_att_type, v2 only the two it implements.
        factor = 1 + (("c2p" in types) + ("p2c" in types) if v2 else len(types))
        scale = np.sqrt(np.float32(head_dim * factor)).astype(np.float32)
        query = query / jnp.asarray(scale, query.dtype)
        logits = jnp.einsum("nqhd,nkhd->nhqk", query, key)

        if getattr(cfg, "relative_attention", False) and types:
            _, _, c2p_index, p2c_index = relative_layout(cfg, seq_len)
            rel = nn.Dropout(cfg.hidden_dropout_prob)(rel_embeddings.astype(self.dtype),
                                                      deterministic=deterministic)
            share = v2 and getattr(cfg, "share_att_key", False)
            if "c2p" in types:
                pos_key = (key_proj(rel) if share
                           else self._dense(width, "pos_key_proj")(rel) if v2
                           else self._dense(width, "pos_proj", use_bias=False)(rel))
                c2p = jnp.einsum("nqhd,rhd->nhqr", query, split_heads(pos_key))
                logits = logits + _gather_last(c2p, c2p_index)
            if "p2c" in types:
                pos_query = (query_proj(rel) if share
                             else self._dense(width, "pos_query_proj" if v2 else "pos_q_proj")(rel))
                pos_query = split_heads(pos_query) / jnp.asarray(scale, pos_query.dtype)
                p2c = jnp.einsum("nkhd,rhd->nhkr", key, pos_query)
                logits = logits + jnp.swapaxes(_gather_last(p2c, p2c_index), -1, -2)

        # Softmax in float32 for bf16 stability; fully masked (padding) rows become uniform,
        # exactly as transformers' masked_fill with the dtype minimum.
        logits = jnp.where(pair_mask, logits.astype(jnp.float32), jnp.finfo(jnp.float32).min)
        probs = nn.softmax(logits, axis=-1)
        probs = nn.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
        context = jnp.einsum("nhqk,nkhd->nqhd", probs.astype(self.dtype), value)
        return context.reshape(batch, seq_len, width)


class DebertaResidualOutput(layer_stack.Part):
    """Dense, dropout, then LayerNorm of the sum with the residual (torch's *Output modules)."""

    @nn.compact
    def __call__(self, hidden, residual, deterministic: bool):
        x = nn.Dense(self.config.hidden_size, dtype=self.dtype, name="dense")(hidden)
        x = nn.Dropout(self.config.hidden_dropout_prob)(x, deterministic=deterministic)
        return _layer_norm(self.config, self.dtype)(x + residual)


class DebertaAttention(layer_stack.Part):
    """Self-attention (``self``) followed by its output block (``output``)."""

    @nn.compact
    def __call__(self, hidden, pair_mask, rel_embeddings, deterministic: bool):
        context = DisentangledSelfAttention(self.config, self.dtype, name="self")(
            hidden, pair_mask, rel_embeddings, deterministic)
        return DebertaResidualOutput(self.config, self.dtype, name="output")(
            context, hidden, deterministic)


class DebertaIntermediate(layer_stack.Part):
    """Feed-forward expansion with the config's activation."""

    @nn.compact
    def __call__(self, hidden):
        x = nn.Dense(self.config.intermediate_size, dtype=self.dtype, name="dense")(hidden)
        return get_activation(self.config.hidden_act)(x)


class DebertaLayer(layer_stack.Layer):
    """One transformer layer: attention, intermediate, output (a step of ``layer_stack``)."""

    @nn.compact
    def __call__(self, hidden, pair_mask, rel_embeddings, index, first):
        """Returns ``(output [N, T, H], None)``. ``index``: this layer's number; ``first``:
        None, or (conv parameters, embeddings, mask) of DeBERTa-v2's convolution, which layer
        0's output is mixed with (``DebertaConvLayer``)."""
        attended = DebertaAttention(self.config, self.dtype, name="attention")(
            hidden, pair_mask, rel_embeddings, self.deterministic)
        expanded = DebertaIntermediate(self.config, self.dtype, name="intermediate")(attended)
        out = DebertaResidualOutput(self.config, self.dtype, name="output")(
            expanded, attended, self.deterministic)
        if first is None:
            return out, None
        conv_params, embeddings, mask = first
        rngs = {} if self.deterministic else {"dropout": self.make_rng("dropout")}
        conv = DebertaConvLayer(self.config, self.dtype, parent=None)
        mixed = lambda y: conv.apply({"params": conv_params}, embeddings, y, mask,
                                     self.deterministic, rngs=rngs)
        return jax.lax.cond(index == 0, mixed, lambda y: y, out), None


class DebertaConvLayer(layer_stack.Part):
    """DeBERTa-v2's convolution that is mixed into the first layer's output."""

    @nn.compact
    def __call__(self, hidden, residual, mask, deterministic: bool):
        """LayerNorm(residual + act(dropout(conv(hidden)))), padding zeroed."""
        cfg = self.config
        kernel = getattr(cfg, "conv_kernel_size", 3)
        pad = (kernel - 1) // 2
        out = nn.Conv(cfg.hidden_size, (kernel,), padding=[(pad, pad)],
                      feature_group_count=getattr(cfg, "conv_groups", 1), dtype=self.dtype,
                      name="conv")(hidden)
        keep = mask[..., None]
        out = jnp.where(keep, out, jnp.zeros((), out.dtype))
        out = nn.Dropout(cfg.hidden_dropout_prob)(out, deterministic=deterministic)
        out = get_activation(getattr(cfg, "conv_act", "tanh"))(out)
        out = _layer_norm(cfg, self.dtype)(residual + out)
        return out * keep.astype(out.dtype)


class DebertaLayerStack(layer_stack.Stack):
    """Torch's ``DebertaEncoder``: relative embeddings, the layers (stacked and scanned under
    the name ``layer``: ``layer_stack``; per-layer names: ``param_names``) and (v2) the conv
    layer after the first."""

    @nn.compact
    def __call__(self, hidden, mask, deterministic: bool, segment_ids=None):
        """Embeddings [N, T, H], mask bool [N, T] -> the last hidden states [N, T, H];
        attention within each packed row of ``segment_ids``."""
        cfg = self.config
        rel = None
        if getattr(cfg, "relative_attention", False):
            table = nn.Embed(_rel_embedding_rows(cfg), cfg.hidden_size,
                             name="rel_embeddings").embedding
            lo, hi, _, _ = relative_layout(cfg, hidden.shape[1])
            rel = table[lo:hi + 1]
            norm = [x.strip() for x in getattr(cfg, "norm_rel_ebd", "none").lower().split("|")]
            if _is_v2(cfg) and "layer_norm" in norm:
                # Row-wise, so normalising only the rows in use equals normalising the table.
                rel = _layer_norm(cfg, jnp.float32)(rel)

        # Built once per call and shared by every layer.
        pair_mask = mask[:, None, :, None] & mask[:, None, None, :]
        if segment_ids is not None:
            pair_mask = pair_mask & segment_attention_mask(segment_ids)
        first = None
        if _is_v2(cfg) and getattr(cfg, "conv_kernel_size", 0) > 0:
            conv = DebertaConvLayer(cfg, self.dtype, name="conv")
            if self.is_initializing():  # creates its parameters; layer 0 applies it
                conv(hidden, hidden, mask, True)
            first = (conv.variables["params"], hidden, mask)
        layers = layer_stack.scanned(
            DebertaLayer, length=cfg.num_hidden_layers, remat=self.remat, unroll=self.unroll,
            in_axes=(nn.broadcast, nn.broadcast, 0, nn.broadcast))
        hidden, _ = layers(cfg, self.dtype, deterministic, name="layer")(
            hidden, pair_mask, rel, jnp.arange(cfg.num_hidden_layers), first)
        return hidden


class DebertaEncoder(layer_stack.Stack):
    """DeBERTa / DeBERTa-v2 without pooler (``encoder_registry.Encoder``): a DebertaConfig or
    DebertaV2Config; packed rows (``segment_ids``) encode as alone, but not with the v2
    convolution (``conv_kernel_size > 0``: NotImplementedError)."""

    @nn.compact
    def __call__(self, input_ids, attention_mask, token_type_ids=None,
                 deterministic: bool = True, segment_ids=None):
        if getattr(self.config, "talking_head", False):
            raise ValueError("DeBERTa talking_head attention is not supported")
        if segment_ids is not None:
            if _is_v2(self.config) and getattr(self.config, "conv_kernel_size", 0) > 0:
                raise NotImplementedError(
                    "segment_ids: packed rows cannot be encoded exactly with the DeBERTa-v2 "
                    f"convolution (conv_kernel_size={self.config.conv_kernel_size}): it mixes "
                    "each token with its neighbours, across row ends into the next packed row "
                    "where an unpacked row sees zeroed padding")
            in_row = segment_ids > 0
            attention_mask = (in_row if attention_mask is None
                              else in_row & attention_mask.astype(bool))
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        mask = attention_mask.astype(bool)
        hidden = DebertaEmbeddings(self.config, self.dtype, name="embeddings")(
            input_ids, token_type_ids, mask, deterministic, segment_ids)
        return DebertaLayerStack(self.config, self.dtype, self.remat, self.unroll, name="encoder")(
            hidden, mask, deterministic, segment_ids)


PUBLISHED = {
    "microsoft/deberta-base": dict(vocab_size=50265, hidden_size=768, num_hidden_layers=12,
        num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512,
        type_vocab_size=0, layer_norm_eps=1e-07, relative_attention=True,
        max_relative_positions=-1, pos_att_type="c2p|p2c", position_biased_input=False,
        pad_token_id=0),
}


# ignore_unexpected: checkpoints ship position_embeddings even where position_biased_input is
# false (Hugging Face's _keys_to_ignore_on_load_unexpected).
FAMILY = Family(name="deberta", model_types=("deberta", "deberta-v2"), build=DebertaEncoder,
                layers=bert.LAYERS, tokenizer=bert.TOKENIZER,
                ignore_unexpected=("position_embeddings",), published=PUBLISHED)
