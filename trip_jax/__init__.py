"""trip-jax: tiered reasoning for TRIP (Storks et al., 2021) in JAX/Flax."""

__version__ = "0.1.0"
