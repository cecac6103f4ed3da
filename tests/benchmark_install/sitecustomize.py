"""Started with this folder on PYTHONPATH, a benchmark process has no torch, as on the main install,
unless it runs the PyTorch reference (``benchmarks.torch_speed``): the trip-jax cases then
neither import it through transformers (about 2 s and 180 MiB at every start) nor count it in
their memory. See conftest's ``benchmark_env``."""

import sys

if "benchmarks.torch_speed" not in sys.orig_argv:
    sys.modules["torch"] = None  # ``import torch`` raises ImportError; find_spec gives up on it
