"""The encoder's shapes for a compile: its config.json, without weights and without the network.

``encoder_config(config)``: a local directory's config.json, else the published sizes of the
configs' hub encoders (``PUBLISHED``, their hub config.json keys that differ from the
transformers class's defaults), else (``model.encoder = ""``) the random encoder's.
"""

from __future__ import annotations

from pathlib import Path

PUBLISHED: dict[str, dict] = {
    "roberta-large": dict(
        model_type="roberta", vocab_size=50265, hidden_size=1024, num_hidden_layers=24,
        num_attention_heads=16, intermediate_size=4096, max_position_embeddings=514,
        type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
        eos_token_id=2),
    "bert-large-uncased": dict(
        model_type="bert", vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
        num_attention_heads=16, intermediate_size=4096, max_position_embeddings=512,
        type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0),
    "microsoft/deberta-base": dict(
        model_type="deberta", vocab_size=50265, hidden_size=768, num_hidden_layers=12,
        num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512,
        type_vocab_size=0, layer_norm_eps=1e-7, relative_attention=True,
        max_relative_positions=-1, pos_att_type="c2p|p2c", position_biased_input=False,
        pad_token_id=0),
    "google/flan-t5-large": dict(
        model_type="t5", vocab_size=32128, d_model=1024, d_kv=64, d_ff=2816, num_layers=24,
        num_heads=16, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),
    "answerdotai/ModernBERT-large": dict(
        model_type="modernbert", vocab_size=50368, hidden_size=1024, intermediate_size=2624,
        num_hidden_layers=28, num_attention_heads=16, global_attn_every_n_layers=3,
        local_attention=128, max_position_embeddings=8192, pad_token_id=50283,
        bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282),
    "sentence-transformers/all-MiniLM-L6-v2": dict(
        model_type="bert", vocab_size=30522, hidden_size=384, num_hidden_layers=6,
        num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512,
        type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0),
}


class UnknownEncoder(ValueError):
    """An encoder that is neither a local directory nor one of ``PUBLISHED``."""


def encoder_config(config):
    """The Hugging Face config of ``config.model``'s encoder (module docstring); UnknownEncoder
    (one line) when its sizes are not known here."""
    from trip_jax.data import tokenizers  # the table above imports nothing (benchmarks read it)
    from trip_jax.models import builders, weights

    name = config.model.encoder
    if not name:
        tokenizer = tokenizers.build_tokenizer(config.model, [])
        return builders.random_encoder_config(config.model, tokenizer)
    if Path(name).expanduser().is_dir():
        return weights.load_config(Path(name).expanduser())
    if name in PUBLISHED:
        return builders.encoder_config_from_dict(PUBLISHED[name])
    raise UnknownEncoder(
        f"--config.model.encoder={name}: no local directory and no published sizes kept here "
        f"(known: {', '.join(PUBLISHED)}); pass a directory holding its config.json")
