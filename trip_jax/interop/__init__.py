"""Across the project's edge: the TRIP authors' saved models (``convert``), the PyTorch oracle."""
