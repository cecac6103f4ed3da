"""BERT (``model_type`` bert) in Flax linen with Hugging Face Flax names, one unit (RoBERTa's and
MPNet's build on its layers). ``BertEncoder(config)`` maps ids, attention mask and token types
[N, T] to the last hidden states [N, T, H] (no pooler), layers stacked; with ``segment_ids`` each
packed row encodes as if alone. Details: docs/reference.md#hand-written-parts-and-why.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from trip_jax.models import layer_stack
from trip_jax.models.activations import get_activation
from trip_jax.encoder_registry import Capabilities, Family, LayerLayout, TokenizerStyle
from trip_jax.models.segments import attention_bias, position_ids


def check_config(config) -> None:
    """Refuses config options this encoder does not implement, instead of silently ignoring them."""
    kind = getattr(config, "position_embedding_type", None) or "absolute"
    if kind != "absolute":
        raise NotImplementedError(
            f"position_embedding_type={kind!r} is not supported (only 'absolute')")
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise NotImplementedError("decoder / cross-attention BERT configs are not supported")
    if config.hidden_size % config.num_attention_heads:
        raise ValueError(
            f"hidden_size={config.hidden_size} is not a multiple of "
            f"num_attention_heads={config.num_attention_heads}")


def _dense(config, features: int, dtype, name: str) -> nn.Dense:
    return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32, name=name,
                    kernel_init=nn.initializers.normal(config.initializer_range))


def _embed(config, num: int, dtype, name: str) -> nn.Embed:
    return nn.Embed(num, config.hidden_size, dtype=dtype, param_dtype=jnp.float32, name=name,
                    embedding_init=nn.initializers.normal(config.initializer_range))


def _layer_norm(config, dtype, name: str = "LayerNorm") -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=dtype, param_dtype=jnp.float32,
                        name=name)


class BertEmbeddings(layer_stack.Part):
    """Word + token type + absolute position embeddings, LayerNorm, dropout."""

    position_offset: bool = False

    @nn.compact
    def __call__(self, input_ids, token_type_ids, deterministic: bool, segment_ids=None):
        cfg = self.config
        words = _embed(cfg, cfg.vocab_size, self.dtype, "word_embeddings")(input_ids)
        # Like torch's nn.Embedding(padding_idx=pad_token_id) in Hugging Face's models: the pad
        # token's vector gets no gradient (only the reference's all-pad padding row gives it one).
        pad = getattr(cfg, "pad_token_id", None)
        if pad is not None:
            words = jnp.where((input_ids == pad)[..., None], jax.lax.stop_gradient(words), words)
        types = _embed(cfg, cfg.type_vocab_size, self.dtype,
                       "token_type_embeddings")(token_type_ids)
        positions = _embed(cfg, cfg.max_position_embeddings, self.dtype, "position_embeddings")(
            position_ids(cfg, input_ids, segment_ids, offset=self.position_offset))
        x = _layer_norm(cfg, self.dtype)(words + types + positions)
        return nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)


class BertSelfAttention(layer_stack.Part):
    """Multi-head scaled dot-product self-attention; attention logits and softmax in float32.

    ``names``: the query, key and value projections' names; ``output``: the name of an output
    projection applied here (MPNet's ``o``), or None (BERT's sits in ``BertResidualOutput``).
    """

    names: tuple[str, str, str] = ("query", "key", "value")
    output: str | None = None

    @nn.compact
    def __call__(self, x, bias, deterministic: bool):
        cfg = self.config
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads
        split = lambda h: h.reshape(h.shape[:-1] + (heads, head_dim))
        query, key, value = (split(_dense(cfg, cfg.hidden_size, self.dtype, name)(x))
                             for name in self.names)
        logits = jnp.einsum("nqhd,nkhd->nhqk", query, key, preferred_element_type=jnp.float32)
        probs = jax.nn.softmax(logits * head_dim ** -0.5 + bias, axis=-1)
        probs = nn.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
        out = jnp.einsum("nhqk,nkhd->nqhd", probs.astype(self.dtype), value)
        out = out.reshape(out.shape[:-2] + (cfg.hidden_size,))
        return out if self.output is None else _dense(cfg, cfg.hidden_size, self.dtype,
                                                      self.output)(out)


class BertResidualOutput(layer_stack.Part):
    """Dense projection, dropout, then LayerNorm of the residual sum (HF's SelfOutput / Output)."""

    @nn.compact
    def __call__(self, h, residual, deterministic: bool):
        cfg = self.config
        h = _dense(cfg, cfg.hidden_size, self.dtype, "dense")(h)
        h = nn.Dropout(cfg.hidden_dropout_prob)(h, deterministic=deterministic)
        return _layer_norm(cfg, self.dtype)(h + residual)


class BertAttention(layer_stack.Part):
    """Self-attention followed by its output projection and residual LayerNorm."""

    @nn.compact
    def __call__(self, x, bias, deterministic: bool):
        h = BertSelfAttention(self.config, self.dtype, name="self")(x, bias, deterministic)
        return BertResidualOutput(self.config, self.dtype, name="output")(h, x, deterministic)


class BertIntermediate(layer_stack.Part):
    """The feed-forward expansion with the config's activation."""

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        h = _dense(cfg, cfg.intermediate_size, self.dtype, "dense")(x)
        return get_activation(cfg.hidden_act)(h)


class BertLayer(layer_stack.Layer):
    """One transformer block: attention (``attention_type``), intermediate, output. Returns
    ``(x, None)``, the carry of ``layer_stack.scanned``."""

    attention_type = BertAttention  # a class attribute, not a field: MPNet's layer swaps it

    @nn.compact
    def __call__(self, x, bias):
        x = self.attention_type(self.config, self.dtype, name="attention")(
            x, bias, self.deterministic)
        h = BertIntermediate(self.config, self.dtype, name="intermediate")(x)
        return BertResidualOutput(self.config, self.dtype, name="output")(
            h, x, self.deterministic), None


class BertTransformer(layer_stack.Stack):
    """HF's ``encoder`` submodule: the layers, stacked and scanned under the name ``layer``
    (``layer_stack``; per-layer names: ``param_names``), optionally rematerialised."""

    @nn.compact
    def __call__(self, x, bias, deterministic: bool):
        layers = layer_stack.scanned(BertLayer, length=self.config.num_hidden_layers,
                                     remat=self.remat, unroll=self.unroll)
        x, _ = layers(self.config, self.dtype, deterministic, name="layer")(x, bias)
        return x


class BertEncoder(layer_stack.Stack):
    """BERT / RoBERTa (``encoder_registry.Encoder``): a BertConfig or RobertaConfig;
    ``position_offset``: positions count from pad_token_id + 1 (``segments.position_ids``);
    ``mask_bias`` replaces the additive bias of masked keys (``segments.attention_bias``)."""

    position_offset: bool = False

    @nn.compact
    def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True,
                 mask_bias: float | None = None, segment_ids=None):
        check_config(self.config)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        x = BertEmbeddings(self.config, self.dtype, self.position_offset, name="embeddings")(
            input_ids, token_type_ids, deterministic, segment_ids)
        # Built once per call and shared by every layer.
        bias = attention_bias(attention_mask, mask_bias, segment_ids)
        return BertTransformer(self.config, self.dtype, self.remat, self.unroll, name="encoder")(
            x, bias, deterministic)


TOKENIZER = TokenizerStyle(
    name="bert",
    special_tokens={"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                    "sep_token": "[SEP]", "mask_token": "[MASK]"},
    cls="[CLS]", sep="[SEP]", single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
    token_types=True)
# Hugging Face's encoder.layer.{i}, stacked here as encoder/layer.
LAYERS = LayerLayout(stacked=("encoder", "layer"), per_layer=("encoder", "layer", "{}"))


PUBLISHED = {
    "bert-large-uncased": dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
        num_attention_heads=16, intermediate_size=4096, max_position_embeddings=512,
        type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0),
    "sentence-transformers/all-MiniLM-L6-v2": dict(vocab_size=30522, hidden_size=384,
        num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
        max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0),
}


FAMILY = Family(name="bert", model_types=("bert",), build=BertEncoder, layers=LAYERS,
                tokenizer=TOKENIZER, capabilities=Capabilities(mask_bias=True), published=PUBLISHED)
