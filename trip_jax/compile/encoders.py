"""The encoder's shapes for a compile: its config.json, without weights and without the network.

``encoder_config(config)``: a local directory's config.json, else the published sizes of the
configs' hub encoders (``PUBLISHED``, kept by each family's unit), else (``model.encoder = ""``)
the random encoder's.
"""

from __future__ import annotations

from pathlib import Path

from trip_jax import encoder_registry as registry

# hub name -> its config.json keys, from the families' units (``Family.published``).
PUBLISHED: dict[str, dict] = registry.published_sizes()


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
