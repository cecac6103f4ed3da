"""Benchmarks: encoder speed, and train/eval throughput, memory, MFU and epoch time of the full
tiered model against the reference's dense padded layout (``python -m benchmarks.run``)."""
