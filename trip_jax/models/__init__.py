"""Flax encoders with Hugging Face parameter names, and the tiered TRIP model."""
