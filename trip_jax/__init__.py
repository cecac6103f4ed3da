"""trip-jax: tiered reasoning for TRIP (Storks et al., 2021) in JAX/Flax.

Importing it keeps JAX off an installed libtpu where no TPU is attached
(``runtime.platforms.skip_absent_tpu``).
"""

from trip_jax.runtime import platforms as _platforms

__version__ = "0.1.0"

_platforms.skip_absent_tpu()
