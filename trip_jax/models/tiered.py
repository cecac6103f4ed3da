"""The tiered TRIP model: encoder rows -> state heads -> conflict detector -> story choice.

Reference semantics: docs/reference.md, "Model"; the settings that reproduce the original
step exactly: docs/exact-mode.md. The model reads the batch contract's arrays (packed or dense
rows) and returns its outputs (``trip_jax.batch_contract``); every architecture number is a
``TieredConfig`` field whose default is the reference value.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from trip_jax import schema
from trip_jax.config_fields import dataclass_from_mapping
from trip_jax.models.bert import BertEncoder
from trip_jax.models.encoders import build_encoder

# Logit given to classes a head does not have: finite, so that 0 * log_softmax stays 0 (no NaN),
# and so negative that softmax gives those classes exactly 0 in float32.
NEG_LOGIT = -1e9

_ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu}
ACTIVATIONS: tuple[str, ...] = tuple(sorted(_ACTIVATIONS))  # model.tiered.detector_activation
STORY_SCORES = ("sum", "max")
PADDING_ROWS = ("zero", "encoded")
PADDING_ROW_ATTENTION = ("legacy", "masked")
# Where the state heads and the detector run: every (B, 2, E, S) cell, or the real ones only.
CELLS = ("grid", "real")
# The additive bias of masked keys in transformers 4.x before 4.21 (the reference ran 4.11).
LEGACY_MASK_BIAS = -10000.0


@dataclasses.dataclass(frozen=True)
class TieredConfig:
    """Architecture of the tiered model; defaults are the reference's (docs/reference.md, "Model").

    The detector width d_model is ``embedding_projection + state_projection`` (256 + 256 = 512).
    ``detector_padding_mask`` masks padded sentences as attention keys and zeroes their detector
    outputs before the flatten; False reproduces the reference, which masked nothing.
    ``story_score`` "sum" is the reference (−Σ beliefs / 2 over the story's entities and
    sentences); "max" scores a story by its strongest belief (−max), so that a story with more
    entity-sentence cells is not penalised for its count of small base-rate beliefs.
    ``state_transitions`` (not the reference) adds explicit evidence of state conflicts to the
    detector input: per sentence and binary attribute, the strongest probability that an effect
    of an earlier sentence contradicts this sentence's precondition, and that this sentence's
    effect contradicts a later precondition (``transition_features``), projected to
    ``state_projection`` and added to the projected state logits (gradient-free, like them), and
    mapped by a Dense(1) straight onto the conflict logit of the same cell. That Dense starts
    with every weight at ``transitions_init_weight`` (a sure contradiction adds 2 to the logit
    of its two sentences): a lecun-normal start at ~±0.2 needs thousands of steps at a head
    learning rate to become decisive, more than a few hundred training pairs give.

    ``padding_rows`` says what the (story, entity, sentence) cells without a real row feed to
    the state heads and the detector. "zero": a zero vector (clean, layout-independent).
    "encoded": what the reference fed them, the encoder's output (position 0) on a row of
    ``padding_row_length`` token ids 0 with an all-zero attention mask and token types 0. Every
    such cell has the same input, so the encoder runs on that one row once per call and its
    vector is broadcast (with dropout on, one draw serves all cells of the step, where the
    reference drew one per cell). ``padding_row_attention`` is how that fully masked row is
    masked: "legacy" as the reference's transformers 4.11 did for BERT/RoBERTa (masked keys get
    an additive -10000, which shifts every score of the row equally: it attends as if unmasked),
    "masked" as the encoder masks any row (BERT/RoBERTa: uniform attention over the row's
    tokens, today's transformers; DeBERTa: its own masking, the only choice for DeBERTa).

    ``cells`` says where the state heads and the detector run. "grid": on every (B, 2, E, S)
    cell and every (story, entity) track of the batch. "real": the heads on the encoder rows
    only, plus one row holding the padding vector, and the detector on the tracks the batch's
    ``track_index`` names (every track without it), plus one all-padding track; padding cells
    and tracks take that extra row's and track's results. The outputs are the same arrays with the same numbers as
    "grid" in deterministic mode (every padding cell has the same input, so it has the same
    result); with dropout on, all padding cells share one dropout draw (and all padding tracks
    one), where "grid" draws one per cell. Both build the same parameters.
    """

    max_sentences: int = 7
    num_classes: tuple[int, ...] = schema.NUM_CLASSES
    head_dropout: float = 0.1
    embedding_projection: int = 256
    state_projection: int = 256
    projection_dropout: float = 0.1
    detector_input_dropout: float = 0.1
    detector_layers: int = 6
    detector_heads: int = 8
    detector_ff: int = 2048
    detector_dropout: float = 0.1
    detector_activation: str = "relu"
    detector_norm_first: bool = False
    detector_layer_norm_eps: float = 1e-5
    detector_padding_mask: bool = True
    conflict_dropout: float = 0.1
    story_score: str = "sum"
    state_transitions: bool = False
    transitions_init_weight: float = 2.0
    padding_rows: str = "zero"
    padding_row_length: int = 16
    padding_row_attention: str = "legacy"
    cells: str = "grid"

    def __post_init__(self):
        object.__setattr__(self, "num_classes", tuple(int(n) for n in self.num_classes))
        if self.detector_d_model % self.detector_heads:
            raise ValueError(
                f"detector width {self.detector_d_model} (embedding_projection + "
                f"state_projection) must be divisible by detector_heads={self.detector_heads}")
        for name, choices in (("detector_activation", ACTIVATIONS),
                              ("story_score", STORY_SCORES), ("padding_rows", PADDING_ROWS),
                              ("padding_row_attention", PADDING_ROW_ATTENTION),
                              ("cells", CELLS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        if self.padding_row_length < 1:
            raise ValueError(f"padding_row_length must be >= 1, got {self.padding_row_length}")

    @property
    def detector_d_model(self) -> int:
        """Width of the conflict detector: the two projections side by side."""
        return self.embedding_projection + self.state_projection

    @property
    def num_attributes(self) -> int:
        """Number of attributes (20 for TRIP)."""
        return len(self.num_classes)

    @property
    def max_classes(self) -> int:
        """Width every head is padded to (9 for TRIP)."""
        return max(self.num_classes)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "TieredConfig":
        """Builds a config from a dict or ConfigDict; an unknown key is an error."""
        return dataclass_from_mapping(cls, values)


def class_mask(num_classes: tuple[int, ...]) -> np.ndarray:
    """Returns bool [A, max_classes]: True where class c exists for attribute a."""
    return np.arange(max(num_classes))[None, :] < np.asarray(num_classes)[:, None]


def real_logit_columns(num_classes: tuple[int, ...]) -> np.ndarray:
    """Indices into a flattened [A * max_classes] logit vector of the real (unpadded) classes.

    Attribute-major, so the gathered vector is the concatenation of the A unpadded heads.
    """
    return np.flatnonzero(class_mask(num_classes).reshape(-1))


def binary_attributes(num_classes: tuple[int, ...]) -> np.ndarray:
    """Indices of the attributes whose labels are 0 unknown / 1 false / 2 true (not locations)."""
    return np.asarray([a for a, name in enumerate(schema.ATTRIBUTES)
                       if name not in schema.LOCATION_ATTRIBUTES and num_classes[a] == 3])


def transition_features(pre_logits: jax.Array, eff_logits: jax.Array, sentence_mask: jax.Array,
                        attributes: np.ndarray) -> jax.Array:
    """Soft evidence of contradicting state transitions along each (story, entity) track.

    ``pre_logits``/``eff_logits`` [N, S, A, C], ``sentence_mask`` bool [N, S]. For sentences
    t < s and a binary attribute a, contradiction(t, s, a) = P(effect_t = true) P(pre_s = false)
    + P(effect_t = false) P(pre_s = true). Returns [N, S, 2·len(attributes)]: per sentence s,
    max over earlier t of contradiction(t, s, ·) (s as the breakpoint), then max over later u of
    contradiction(s, u, ·) (s as the evidence); 0 where no such sentence exists.
    """
    pre = jax.nn.softmax(pre_logits[..., attributes, :], axis=-1)
    eff = jax.nn.softmax(eff_logits[..., attributes, :], axis=-1)
    # [N, t, s, a]: earlier effect true and later precondition false, or the other way round.
    contradiction = (eff[:, :, None, :, 2] * pre[:, None, :, :, 1]
                     + eff[:, :, None, :, 1] * pre[:, None, :, :, 2])
    num_sentences = sentence_mask.shape[-1]
    earlier = np.triu(np.ones((num_sentences, num_sentences), bool), k=1)  # [t, s]: t < s
    valid = (earlier[None, :, :] & sentence_mask[:, :, None] & sentence_mask[:, None, :])
    contradiction = jnp.where(valid[..., None], contradiction, 0.0)
    as_breakpoint = contradiction.max(axis=1)  # over earlier t: [N, s, a]
    as_evidence = contradiction.max(axis=2)    # over later s: [N, t, a]
    return jnp.concatenate([as_breakpoint, as_evidence], axis=-1)


def scatter_rows(row_values: jax.Array, row_index: jax.Array, row_shape: tuple[int, ...]
                 ) -> jax.Array:
    """Scatters per-encoder-row vectors [R, H] to a dense [*row_shape, H] grid.

    ``row_index`` holds flat indices into ``row_shape``; padding rows point one past the end and
    are dropped. Cells no row writes stay 0.
    """
    num_cells = int(np.prod(row_shape))
    dense = jnp.zeros((num_cells, row_values.shape[-1]), row_values.dtype)
    dense = dense.at[row_index].set(row_values, mode="drop")
    return dense.reshape(*row_shape, row_values.shape[-1])


def scatter_over_padding(values: jax.Array, index: jax.Array, size: int) -> jax.Array:
    """Places ``values[:-1]`` at ``index`` in an array of ``size`` entries filled with
    ``values[-1]`` (the padding entry's value); indices outside 0..size-1 are dropped.

    ``values`` [N + 1, ...], ``index`` int [N]; returns [size, ...].
    """
    fill = jnp.broadcast_to(values[-1], (size, *values.shape[1:]))
    return fill.at[index].set(values[:-1], mode="drop")


def cells_to_tracks(cell_values: jax.Array, padding_value, track_index: jax.Array,
                    num_sentences: int) -> jax.Array:
    """Gathers the (story, entity) tracks ``track_index`` names and appends a padding track.

    ``cell_values`` [B*2*E*S, ...] per cell; returns [K + 1, S, ...]: the K tracks (an index
    past the last track gives the last track, for its result to be dropped), then S copies of
    ``padding_value``.
    """
    tracks = cell_values.reshape(-1, num_sentences, *cell_values.shape[1:])
    gathered = jnp.take(tracks, track_index, axis=0, mode="clip")
    padding = jnp.broadcast_to(jnp.asarray(padding_value, cell_values.dtype),
                               (1, num_sentences, *cell_values.shape[1:]))
    return jnp.concatenate([gathered, padding])


class _StateHead(nn.Module):
    """One classification head: dropout -> Dense(H) -> tanh -> dropout -> Dense(out)."""

    hidden: int
    num_out: int
    dropout: float
    deterministic: bool

    @nn.compact
    def __call__(self, h):
        x = nn.Dropout(self.dropout)(h, deterministic=self.deterministic)
        x = jnp.tanh(nn.Dense(self.hidden, name="dense")(x))
        x = nn.Dropout(self.dropout)(x, deterministic=self.deterministic)
        return nn.Dense(self.num_out, name="out_proj")(x)


class StateHeads(nn.Module):
    """The 2·A precondition/effect heads as one vmapped head with stacked parameters.

    Parameters carry a leading axis of size 2·A (preconditions first, then effects, attributes in
    schema order); each head draws its own dropout masks. Every head outputs max_classes logits;
    classes an attribute lacks are set to ``NEG_LOGIT``, so softmax/argmax equal those of an
    n_a-class head.
    """

    config: TieredConfig

    @nn.compact
    def __call__(self, h, *, deterministic: bool = True):
        """Maps embeddings [N, H] to (pre_logits, eff_logits), each [N, A, max_classes]."""
        cfg = self.config
        num_heads = 2 * cfg.num_attributes
        stacked = nn.vmap(
            _StateHead,
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": True},
            in_axes=None,
            out_axes=0,
            axis_size=num_heads,
        )
        logits = stacked(hidden=h.shape[-1], num_out=cfg.max_classes, dropout=cfg.head_dropout,
                         deterministic=deterministic, name="heads")(h)  # [2A, N, C]
        valid = np.tile(class_mask(cfg.num_classes), (2, 1))[:, None, :]
        logits = jnp.where(valid, logits, NEG_LOGIT)
        logits = logits.reshape(2, cfg.num_attributes, *logits.shape[1:])
        logits = jnp.moveaxis(logits, 1, -2)  # [2, N, A, C]
        return logits[0], logits[1]


class DetectorLayer(nn.Module):
    """A PyTorch-style TransformerEncoderLayer (post-LayerNorm unless ``norm_first``)."""

    config: TieredConfig

    @nn.compact
    def __call__(self, x, key_mask, *, deterministic: bool):
        """x [N, S, D]; key_mask bool [N, S] (keys attended to) or None."""
        cfg = self.config
        drop = lambda y: nn.Dropout(cfg.detector_dropout)(y, deterministic=deterministic)
        norm = lambda name: nn.LayerNorm(epsilon=cfg.detector_layer_norm_eps, name=name)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        attention = nn.MultiHeadDotProductAttention(
            num_heads=cfg.detector_heads, dropout_rate=cfg.detector_dropout,
            deterministic=deterministic, name="self_attention")

        def feed_forward(y):
            y = nn.Dense(cfg.detector_ff, name="ff_in")(y)
            y = drop(_ACTIVATIONS[cfg.detector_activation](y))
            return nn.Dense(cfg.detector_d_model, name="ff_out")(y)

        if cfg.detector_norm_first:
            y = norm("attention_norm")(x)
            x = x + drop(attention(y, mask=mask))
            return x + drop(feed_forward(norm("ff_norm")(x)))
        x = norm("attention_norm")(x + drop(attention(x, mask=mask)))
        return norm("ff_norm")(x + drop(feed_forward(x)))


class ConflictDetector(nn.Module):
    """Transformer over the S sentences of each (story, entity) track -> conflict logits [N, S]."""

    config: TieredConfig

    @nn.compact
    def __call__(self, x, sentence_mask, *, deterministic: bool = True):
        """x [N, S, D] detector inputs; sentence_mask bool [N, S]. Returns logits [N, S]."""
        cfg = self.config
        use_mask = cfg.detector_padding_mask
        x = nn.Dropout(cfg.detector_input_dropout)(x, deterministic=deterministic)
        for i in range(cfg.detector_layers):
            x = DetectorLayer(cfg, name=f"layer_{i}")(
                x, sentence_mask if use_mask else None, deterministic=deterministic)
        if use_mask:
            # Padded sentences carry nothing: keep them out of the flatten -> Dense(S).
            x = x * sentence_mask[..., None]
        x = x.reshape(x.shape[0], -1)
        x = nn.Dropout(cfg.conflict_dropout)(x, deterministic=deterministic)
        return nn.Dense(cfg.max_sentences, name="conflict_out")(x)


class TieredModel(nn.Module):
    """The tiered reasoning model (docs/reference.md, "Model") over batch-contract arrays.

    ``encoder`` is a module following the encoder contract (see ``build_tiered_model`` to build
    it from a Hugging Face config); its parameters live under ``params["encoder"]``.
    """

    encoder: nn.Module
    config: TieredConfig = TieredConfig()

    @nn.compact
    def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True
                 ) -> dict[str, jax.Array]:
        """Returns the Model output contract for a batch (only the input arrays are read).

        Keys: pre_logits / eff_logits [B,2,E,S,A,C], pre_pred / eff_pred [B,2,E,S,A],
        conflict_logits [B,2,E,S] (pre-sigmoid, for a stable loss), conflict_prob [B,2,E,S],
        story_score [B,2], story_pred [B]. With ``config.cells == "real"`` the detector runs on
        the batch's ``track_index`` (int32 [K], ``trip_jax.data.layouts.packing.track_index``;
        the packed_tokens layout has it), or on every track where the batch has none.
        """
        cfg = self.config
        row_mask = jnp.asarray(batch["row_mask"], bool)
        grid = row_mask.shape  # (B, 2, E, S)
        num_sentences = grid[-1]
        if num_sentences != cfg.max_sentences:
            raise ValueError(f"batch has S={num_sentences} sentences but config.max_sentences="
                             f"{cfg.max_sentences}")

        rows, row_index = self.row_embeddings(batch, deterministic)
        if cfg.cells == "real":
            # The encoder rows on real cells, then one row of the padding vector that every
            # other cell (padding rows of the dense layout too) is given.
            num_cells = int(np.prod(grid))
            padding = (self.padding_row_embedding(deterministic)[None]
                       if cfg.padding_rows == "encoded"
                       else jnp.zeros((1, rows.shape[-1]), jnp.float32))
            on_real_cell = (row_index < num_cells) & row_mask.reshape(-1)[
                jnp.minimum(row_index, num_cells - 1)]
            h_flat = jnp.concatenate([jnp.where(on_real_cell[:, None], rows, padding), padding])
        else:
            h = scatter_rows(rows, row_index, grid)
            # Dense-layout padding rows hold pad-token embeddings: replace them (zero, or the
            # reference's padding-row vector) so that both layouts feed identical values
            # downstream.
            if cfg.padding_rows == "encoded":
                h = jnp.where(row_mask[..., None], h, self.padding_row_embedding(deterministic))
            else:
                h = h * row_mask[..., None]
            h_flat = h.reshape(-1, h.shape[-1])

        pre_logits, eff_logits = StateHeads(cfg, name="state_heads")(
            h_flat, deterministic=deterministic)

        # Detector input: projected embedding ++ projected (gradient-free) real state logits.
        columns = real_logit_columns(cfg.num_classes)
        states = jnp.concatenate([pre_logits.reshape(len(h_flat), -1)[:, columns],
                                  eff_logits.reshape(len(h_flat), -1)[:, columns]], axis=-1)
        states = jax.lax.stop_gradient(states)
        drop = lambda y: nn.Dropout(cfg.projection_dropout)(y, deterministic=deterministic)
        projected_states = nn.Dense(cfg.state_projection, name="states_proj")(drop(states))
        embedded = nn.Dense(cfg.embedding_projection, name="embedding_proj")(drop(h_flat))

        if cfg.cells == "real":
            # Per-row values -> the grid (padding cells: the padding row's) -> the tracks the
            # batch names, then one padding track.
            # Batches of the row layouts name no tracks: then every track runs (same results).
            track_index = (jnp.asarray(batch["track_index"], jnp.int32) if "track_index" in batch
                           else jnp.arange(int(np.prod(grid[:-1])), dtype=jnp.int32))
            to_grid = lambda values: scatter_over_padding(values, row_index, num_cells)
            tracks_of = lambda grid_values, padding_value: cells_to_tracks(
                grid_values, padding_value, track_index, num_sentences)
            track_mask = tracks_of(row_mask.reshape(-1), False)
            embedded = tracks_of(to_grid(embedded), embedded[-1])
            projected_states = tracks_of(to_grid(projected_states), projected_states[-1])
            row_pre, row_eff = pre_logits, eff_logits
            pre_logits, eff_logits = to_grid(row_pre), to_grid(row_eff)
            logit_tracks = lambda: (tracks_of(pre_logits, row_pre[-1]),
                                    tracks_of(eff_logits, row_eff[-1]))
        else:
            track_mask = row_mask.reshape(-1, num_sentences)
            logit_tracks = lambda: tuple(
                logits.reshape(-1, num_sentences, *logits.shape[1:])
                for logits in (pre_logits, eff_logits))
        num_tracks = len(track_mask)
        embedded = embedded.reshape(num_tracks * num_sentences, -1)
        projected_states = projected_states.reshape(num_tracks * num_sentences, -1)

        if cfg.state_transitions:
            transitions = transition_features(*logit_tracks(), track_mask,
                                              binary_attributes(cfg.num_classes))
            transitions = jax.lax.stop_gradient(transitions).reshape(len(embedded), -1)
            projected_states = projected_states + nn.Dense(
                cfg.state_projection, name="transitions_proj")(transitions)
        features = jnp.concatenate([embedded, projected_states], axis=-1)

        tracks = features.reshape(num_tracks, num_sentences, cfg.detector_d_model)
        conflict_logits = ConflictDetector(cfg, name="detector")(
            tracks, track_mask, deterministic=deterministic)  # [tracks, S]
        if cfg.state_transitions:
            # A direct linear path as well: a contradiction raises the belief in its two
            # sentences without having to pass through the detector's layers.
            direct = nn.Dense(1, name="transitions_out", kernel_init=nn.initializers.constant(
                cfg.transitions_init_weight))
            conflict_logits = conflict_logits + direct(transitions).reshape(conflict_logits.shape)
        if cfg.cells == "real":
            conflict_logits = scatter_over_padding(conflict_logits, track_index,
                                                   num_cells // num_sentences)
        conflict_logits = conflict_logits.reshape(grid)
        conflict_prob = jax.nn.sigmoid(conflict_logits) * row_mask

        if cfg.story_score == "max":
            story_score = -conflict_prob.max(axis=(2, 3))
        else:
            story_score = -conflict_prob.sum(axis=(2, 3)) / 2
        row_shape = (*grid, cfg.num_attributes, cfg.max_classes)
        pre_logits, eff_logits = pre_logits.reshape(row_shape), eff_logits.reshape(row_shape)
        return {
            "pre_logits": pre_logits,
            "eff_logits": eff_logits,
            "pre_pred": _masked_argmax(pre_logits, row_mask),
            "eff_pred": _masked_argmax(eff_logits, row_mask),
            "conflict_logits": conflict_logits,
            "conflict_prob": conflict_prob,
            "story_score": story_score,
            "story_pred": jnp.argmax(story_score, axis=-1).astype(jnp.int32),
        }

    def row_embeddings(self, batch: Mapping[str, jax.Array], deterministic: bool = True
                       ) -> tuple[jax.Array, jax.Array]:
        """The encoder's vector at each row's first token, and the row's cell.

        Every layout gives the encoder sequences ``input_ids`` [N, L] (with ``segment_ids``
        where several rows share a sequence: the encoder then attends within a segment and
        restarts positions there) and each row's first token ``row_start`` (flat n*L + l).
        Returns rows float32 [R, H] and row_index int32 [R], the flat (B, 2, E, S) cell of each
        row (B*2*E*S for a padding row).
        """
        hidden = self.encoder(batch["input_ids"], batch["attention_mask"],
                              token_type_ids=batch["token_type_ids"],
                              deterministic=deterministic, segment_ids=batch.get("segment_ids"))
        flat = hidden.reshape(-1, hidden.shape[-1])
        return (flat[jnp.asarray(batch["row_start"], jnp.int32)].astype(jnp.float32),
                jnp.asarray(batch["row_index"], jnp.int32))

    def padding_row_embedding(self, deterministic: bool = True) -> jax.Array:
        """The reference's padding-row vector [H]: the encoder's position-0 output on one row of
        ``padding_row_length`` token ids 0, attention mask 0 and token types 0 (masked as
        ``padding_row_attention`` says)."""
        cfg = self.config
        zeros = jnp.zeros((1, cfg.padding_row_length), jnp.int32)
        extra = {}
        if cfg.padding_row_attention == "legacy":
            if not isinstance(self.encoder, BertEncoder):
                raise ValueError("padding_row_attention='legacy' reproduces transformers 4.11's "
                                 "additive mask of BERT/RoBERTa; use 'masked' for "
                                 f"{type(self.encoder).__name__}")
            extra["mask_bias"] = LEGACY_MASK_BIAS
        hidden = self.encoder(zeros, zeros, token_type_ids=zeros, deterministic=deterministic,
                              **extra)
        return hidden[0, 0, :].astype(jnp.float32)


def _masked_argmax(logits: jax.Array, row_mask: jax.Array) -> jax.Array:
    """Argmax over classes as int32, 0 on padded rows."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32) * row_mask[..., None]


def build_tiered_model(hf_config, config: TieredConfig = TieredConfig(), *,
                       dtype=jnp.float32, remat: bool = False) -> TieredModel:
    """Builds a TieredModel whose encoder comes from ``build_encoder(hf_config)``.

    ``dtype``/``remat`` go to the encoder; the heads and detector compute in float32.
    """
    return TieredModel(encoder=build_encoder(hf_config, dtype=dtype, remat=remat), config=config)
