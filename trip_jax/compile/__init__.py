"""Compile-only checks: the config's real train and eval steps compiled by XLA:TPU for a Cloud TPU
accelerator type from a machine without one (``--mode=compile``). Details: docs/compile.md."""
