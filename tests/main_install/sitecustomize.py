"""Started with this folder on PYTHONPATH, a Python process has no torch, as on the main install
(``pip install -e .``: torch is a test dependency only). transformers then neither imports it
(about 2 s at every start) nor offers models that need it. See conftest's ``main_install``."""

import sys

sys.modules["torch"] = None  # ``import torch`` raises ImportError; find_spec gives up on it
