"""Tiny random Hugging Face PyTorch encoders of any registered model type, and the parity checks
every family's test makes against them: a padded batch of rows and a packed one (two rows a
sequence), each compared with the torch model's last hidden states within a tolerance."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import torch
import transformers

from trip_jax import encoder_registry as registry
from trip_jax.encoder_registry import build_encoder
from trip_jax.models import builders

# ``model.random_encoder``'s keys (Hugging Face BERT names): each unit's ``random_config`` maps
# them to its own config, as a random encoder's are.
TINY = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1)
# The model class whose checkpoint holds the encoder alone, where AutoModel's does not, and one
# with more than the encoder (heads, a decoder), where AutoModelForMaskedLM has none.
ENCODER_ONLY = {"t5": "T5EncoderModel"}
WITH_HEADS = {"t5": "T5ForConditionalGeneration"}


def tiny_config(model_type: str, **overrides) -> transformers.PretrainedConfig:
    """The tiny random config of ``model_type`` as its family builds one, its pad id the
    family's tokenizer's and two token types where that tokenizer has them, then
    ``overrides`` (the family's config keywords)."""
    family = registry.family_of(model_type)
    style = family.tokenizer
    values = dict(TINY, model_type=model_type,
                  pad_token_id=list(style.special_tokens).index("pad_token"),
                  type_vocab_size=2 if style.token_types else 1)
    if family.random_config is not None:
        values = family.random_config(values)
    return builders.encoder_config_from_dict({**values, **overrides})


def tiny_torch_model(model_type: str, model_cls=None, *, heads: bool = False, **overrides):
    """The torch model (``model_cls``; default the encoder alone, with ``heads`` one with more)
    of ``tiny_config``, every tensor perturbed (norms start at 1, biases at 0: each one then
    matters), eager attention."""
    torch.manual_seed(0)
    config = tiny_config(model_type, **overrides)
    config._attn_implementation = "eager"
    if model_cls is None:
        table, auto = ((WITH_HEADS, transformers.AutoModelForMaskedLM) if heads
                       else (ENCODER_ONLY, transformers.AutoModel))
        model_cls = (getattr(transformers, table[model_type]) if model_type in table
                     else auto.from_config)
    model = model_cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def save_both(model, root: Path) -> tuple[Path, Path]:
    """``model`` saved twice under ``root``: (a model.safetensors directory, a
    pytorch_model.bin one)."""
    st_dir, bin_dir = root / "safetensors", root / "bin"
    model.save_pretrained(st_dir)
    model.config.save_pretrained(bin_dir)
    torch.save(model.state_dict(), bin_dir / "pytorch_model.bin")
    return st_dir, bin_dir


def random_rows(lengths, vocab_size: int, seed: int = 0) -> list[np.ndarray]:
    """Rows of random token ids (2 .. vocab_size - 1) of the given lengths."""
    rs = np.random.RandomState(seed)
    return [rs.randint(2, vocab_size, n).astype(np.int32) for n in lengths]


def _types(config, ids: np.ndarray) -> np.ndarray | None:
    """Token types 0 then 1 (from the fourth token) like a sentence-pair tokenizer's where the
    family reads two, else None."""
    if not (registry.family_of(config.model_type).capabilities.token_types
            and getattr(config, "type_vocab_size", 0) > 1):
        return None
    types = np.zeros_like(ids)
    types[..., 3:] = 1
    return types


def torch_hidden(model, ids, mask, types=None) -> np.ndarray:
    """The torch model's last hidden states of ``ids`` under ``mask`` (and ``types``)."""
    as_long = lambda a: torch.tensor(np.asarray(a), dtype=torch.long)
    extra = {} if types is None else {"token_type_ids": as_long(types)}
    with torch.no_grad():
        return model(input_ids=as_long(ids), attention_mask=as_long(mask),
                     **extra).last_hidden_state.numpy()


def assert_padded_rows_match(model, config, params, tol: float, lengths=(12, 9, 3)) -> None:
    """Rows of ``lengths`` tokens padded with the pad id to the longest: ours equal torch's on
    every token, padding included."""
    ids = np.full((len(lengths), max(lengths)), config.pad_token_id, np.int32)
    mask = np.zeros_like(ids)
    for i, row in enumerate(random_rows(lengths, config.vocab_size)):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    types = _types(config, ids)
    if types is not None:
        types *= mask
    ours = jax.jit(build_encoder(config).apply)({"params": params}, ids, mask, types)
    diff = np.abs(np.asarray(ours) - torch_hidden(model, ids, mask, types))
    assert diff.max() <= tol, diff.max()


def assert_packed_rows_match(model, config, params, tol: float) -> None:
    """Rows of 5, 12, 3 and 7 tokens packed two a sequence of 20 (segment ids 1, 2): each row's
    states equal torch's of that row alone."""
    rows = random_rows([5, 12, 3, 7], config.vocab_size, seed=1)
    # Two sequences of 20 tokens: rows 1+2 (17 tokens, 3 padding), rows 3+4 (10, 10 padding).
    ids = np.full((2, 20), config.pad_token_id, np.int32)
    segments, types = np.zeros_like(ids), np.zeros_like(ids)
    starts = []
    for n, pair in enumerate(((0, 1), (2, 3))):
        at = 0
        for k, r in enumerate(pair):
            ids[n, at:at + len(rows[r])], segments[n, at:at + len(rows[r])] = rows[r], k + 1
            row_types = _types(config, rows[r])
            if row_types is not None:
                types[n, at:at + len(rows[r])] = row_types
            starts.append((n, at))
            at += len(rows[r])
    hidden = jax.jit(build_encoder(config).apply)(
        {"params": params}, ids, (segments > 0).astype(np.int32), types, segment_ids=segments)
    for row, (n, at) in zip(rows, starts):
        alone = torch_hidden(model, row[None], np.ones((1, len(row)), np.int32),
                             _types(config, row[None]))[0]
        diff = np.abs(np.asarray(hidden[n, at:at + len(row)]) - alone).max()
        assert diff <= tol, diff
