"""Process-wide JAX settings from the config (trip_jax.runtime.jax_setup)."""

import jax
import pytest
from ml_collections import ConfigDict

from configs import base
from trip_jax.config import messages
from trip_jax.config.typed import typed
from trip_jax.runtime import jax_setup


@pytest.fixture
def restore_jax_config():
    keys = ("jax_default_prng_impl", "jax_compilation_cache_dir",
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")
    saved = {k: getattr(jax.config, k) for k in keys}
    yield
    for key, value in saved.items():
        jax.config.update(key, value)


def _config(prng_impl="threefry2x32", cache=""):
    return ConfigDict({"train": {"prng_impl": prng_impl, "compilation_cache_dir": cache}})


def test_defaults_leave_jax_as_it_is(restore_jax_config):
    jax_setup.configure_jax(_config())
    assert jax.config.jax_default_prng_impl == "threefry2x32"
    assert not jax.config.jax_compilation_cache_dir
    assert jax.random.key_data(jax.random.key(0)).shape == (2,)


def test_rbg_keys_and_cache_directory(restore_jax_config, tmp_path):
    jax_setup.configure_jax(_config("rbg", str(tmp_path / "cache")))
    assert jax.random.key_data(jax.random.key(0)).shape == (4,)  # rbg keys are 4 words
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")


def test_unknown_prng_impl_is_refused_by_the_schema_before_jax_is_configured():
    # The one check of train.prng_impl is its schema declaration (trip_jax/config/sections.py).
    config = base.get_config()
    config.train.prng_impl = "philox"
    with pytest.raises(messages.ConfigError, match="train.prng_impl: unknown value 'philox'"):
        typed(config)
