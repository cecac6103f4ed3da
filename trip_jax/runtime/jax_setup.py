"""Process-wide JAX settings chosen in the config: the PRNG implementation and a persistent
compilation cache. Both are off by default (the reference behaviour); call ``configure_jax``
before any key is made or any function is compiled. ``quiet_backend_search`` keeps jax's lines
about backends it looked for and did not find out of the default output."""

from __future__ import annotations

import contextlib
import logging as std_logging
import os
from collections.abc import Iterator

import jax
from absl import logging


# The jax logger that reports each backend it tried at start-up ("Unable to initialize backend
# 'tpu': ... libtpu.so" on every CPU machine) at INFO.
BACKEND_LOGGER = "jax._src.xla_bridge"


def quiet_backend_search() -> None:
    """Hides the INFO lines of jax's backend search unless the log is at debug level
    (``--verbosity=1``); its warnings and errors still show, and which backends jax uses
    (``JAX_PLATFORMS``, a GPU, a TPU) is unchanged. Call before the first ``jax.devices()``."""
    if logging.get_verbosity() < logging.DEBUG:
        std_logging.getLogger(BACKEND_LOGGER).setLevel(std_logging.WARNING)


def set_prng_impl(name: str) -> None:
    """Makes ``name`` (train.prng_impl: "threefry2x32", JAX's default, or "rbg", which draws
    dropout masks faster but other ones) the implementation of every new ``jax.random.key``."""
    jax.config.update("jax_default_prng_impl", name)


@contextlib.contextmanager
def prng_impl(name: str) -> Iterator[None]:
    """``set_prng_impl(name)`` for the block only: the implementation set before comes back
    after it, also on an error."""
    previous = jax.config.jax_default_prng_impl
    set_prng_impl(name)
    try:
        yield
    finally:
        set_prng_impl(previous)


def enable_compilation_cache(directory: str) -> str:
    """Keeps compiled programs in ``directory`` so that a later process with the same shapes
    loads them instead of compiling again; returns the absolute directory."""
    directory = directory if "://" in directory else os.path.abspath(
        os.path.expanduser(directory))
    jax.config.update("jax_compilation_cache_dir", directory)
    # Every train/eval step program is worth keeping; tiny helper programs are not.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory


def configure_jax(config) -> None:
    """Applies ``config.train.prng_impl`` and ``config.train.compilation_cache_dir``."""
    set_prng_impl(config.train.prng_impl)
    if config.train.compilation_cache_dir:
        directory = enable_compilation_cache(config.train.compilation_cache_dir)
        logging.info("persistent compilation cache: %s", directory)
