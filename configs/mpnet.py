r"""MPNet (all-mpnet-base-v2, 110M), offline from PyPI (docs/reference.md#mpnet), else the hub.

Command: ``python -m trip_jax.main --config=configs/mpnet.py --workdir=workdirs/mpnet`` (the
tuned recipe: 4 epochs of dev_all at lr 3e-5, decided on dev folds 0-1, results/mpnet_cv/; then
test). Expected on test: 78.8 / 53.1 / 31.2 (seeds 22-24, results/mpnet/summary.md).
"""

from configs import base

ENCODER = "sentence-transformers/all-mpnet-base-v2"


def get_config(argument: str | None = None):
    """Returns the MPNet configuration (argument: fidelity, recipe and/or losses,
    configs/base.py; default fidelity clean, recipe tuned)."""
    config = base.get_config(argument, default_fidelity="clean", default_recipe="tuned")
    config.model.encoder = ENCODER
    config.train.eval_batch_size = 16
    config.train.prng_impl = "rbg"  # faster dropout masks on CPU (other masks, same model)
    if config.recipe == "tuned":
        config.train.learning_rate = 3e-5
        config.train.num_epochs = 4
        config.data.protocol = "dev_all"
    else:
        config.train.learning_rate = 5e-5   # the BERT-family rate of the paper
    config.data.buckets.token_multiple = 16
    return config
