"""The tiered TRIP model: encoder rows -> state heads -> conflict detector -> story choice.

``build_tiered_model(hf_config, config)`` builds the ``TieredModel`` that maps the batch
contract's input arrays to its model outputs, with the original's pieces the config chooses
(``trip_jax.reference``). Details: docs/reference.md#model, docs/fidelity.md.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from trip_jax.config.sections import TieredConfig
from trip_jax.data.schema import MAX_CLASSES, NUM_ATTRIBUTES, NUM_CLASSES
from trip_jax.models import layer_stack
from trip_jax.models.cells import RealCells
from trip_jax.encoder_registry import build_encoder
from trip_jax.reference.grid_cells import GridCells
from trip_jax.reference.padding_row import PaddingRow

# Logit given to classes a head does not have: finite, so that 0 * log_softmax stays 0 (no NaN),
# and so negative that softmax gives those classes exactly 0 in float32.
NEG_LOGIT = -1e9

_ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu}


def class_mask(num_classes: tuple[int, ...]) -> np.ndarray:
    """Returns bool [A, max_classes]: True where class c exists for attribute a."""
    return np.arange(max(num_classes))[None, :] < np.asarray(num_classes)[:, None]


def real_logit_columns(num_classes: tuple[int, ...]) -> np.ndarray:
    """Indices into a flattened [A * max_classes] logit vector of the real (unpadded) classes.

    Attribute-major, so the gathered vector is the concatenation of the A unpadded heads.
    """
    return np.flatnonzero(class_mask(num_classes).reshape(-1))


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
        num_heads = 2 * NUM_ATTRIBUTES
        stacked = nn.vmap(
            _StateHead,
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": True},
            in_axes=None,
            out_axes=0,
            axis_size=num_heads,
        )
        logits = stacked(hidden=h.shape[-1], num_out=MAX_CLASSES, dropout=cfg.head_dropout,
                         deterministic=deterministic, name="heads")(h)  # [2A, N, C]
        valid = np.tile(class_mask(NUM_CLASSES), (2, 1))[:, None, :]
        logits = jnp.where(valid, logits, NEG_LOGIT)
        logits = logits.reshape(2, NUM_ATTRIBUTES, *logits.shape[1:])
        logits = jnp.moveaxis(logits, 1, -2)  # [2, N, A, C]
        return logits[0], logits[1]


class DetectorLayer(nn.Module):
    """A PyTorch-style TransformerEncoderLayer (post-LayerNorm unless ``norm_first``)."""

    config: TieredConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, key_mask):
        """x [N, S, D]; key_mask bool [N, S] (keys attended to) or None. Returns ``(x, None)``,
        the carry of ``layer_stack.scanned``."""
        cfg = self.config
        deterministic = self.deterministic
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
            return x + drop(feed_forward(norm("ff_norm")(x))), None
        x = norm("attention_norm")(x + drop(attention(x, mask=mask)))
        return norm("ff_norm")(x + drop(feed_forward(x))), None


class ConflictDetector(nn.Module):
    """Transformer over the S sentences of each (story, entity) track -> conflict logits [N, S].

    The layers are stacked and scanned under the name ``layers`` (``layer_stack``; per-layer
    names ``layer_<i>``: ``param_names``)."""

    config: TieredConfig
    max_sentences: int

    @nn.compact
    def __call__(self, x, sentence_mask, *, deterministic: bool = True):
        """x [N, S, D] detector inputs; sentence_mask bool [N, S]. Returns logits [N, S]."""
        cfg = self.config
        use_mask = cfg.detector_padding_mask
        x = nn.Dropout(cfg.detector_input_dropout)(x, deterministic=deterministic)
        if cfg.detector_layers:
            layers = layer_stack.scanned(DetectorLayer, length=cfg.detector_layers)
            x, _ = layers(cfg, deterministic, name="layers")(
                x, sentence_mask if use_mask else None)
        if use_mask:
            # Padded sentences carry nothing: keep them out of the flatten -> Dense(S).
            x = x * sentence_mask[..., None]
        x = x.reshape(x.shape[0], -1)
        x = nn.Dropout(cfg.conflict_dropout)(x, deterministic=deterministic)
        return nn.Dense(self.max_sentences, name="conflict_out")(x)


class TieredModel(nn.Module):
    """The tiered reasoning model (docs/reference.md#model) over batch-contract arrays, built
    by ``build_tiered_model``: ``encoder`` (``encoder_registry.Encoder``, its parameters under
    ``params["encoder"]``), S = ``max_sentences``, every matmul at ``matmul_precision``; the
    original's ``padding_row`` (or None: padding cells get 0) and the ``cell_view`` the heads
    and the detector run on (``RealCells``, or the original's ``GridCells``)."""

    encoder: nn.Module
    max_sentences: int
    config: TieredConfig = TieredConfig()
    matmul_precision: str = "default"
    padding_row: PaddingRow | None = None
    cell_view: Any = RealCells

    def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True,
                 pieces: int = 1) -> dict[str, jax.Array]:
        """Returns the Model output contract for a batch (only the input arrays are read).

        Keys: pre_logits / eff_logits [B,2,E,S,A,C], pre_pred / eff_pred [B,2,E,S,A],
        conflict_logits [B,2,E,S] (pre-sigmoid, for a stable loss), conflict_prob [B,2,E,S],
        story_logits [B,2], story_pred [B]. ValueError if S != ``max_sentences``. ``pieces``:
        the batch's pieces (``row_embeddings``; the steps pass their mesh's batch shards).
        """
        with jax.default_matmul_precision(self.matmul_precision):
            return self.outputs(batch, deterministic, pieces)

    @nn.compact
    def outputs(self, batch: Mapping[str, jax.Array], deterministic: bool, pieces: int = 1
                ) -> dict[str, jax.Array]:
        """``__call__`` at the precision in force."""
        cfg = self.config
        num_sentences = np.shape(batch["row_mask"])[-1]
        if num_sentences != self.max_sentences:
            raise ValueError(f"batch has S={num_sentences} sentences but max_sentences="
                             f"{self.max_sentences}")

        # Encoder rows -> the head inputs of the cells the heads run on.
        rows, row_index, padding = self.row_embeddings(batch, deterministic, pieces)
        cells = self.cell_view.over(batch, row_index)
        h = cells.gather(rows, padding)

        # State heads.
        pre_logits, eff_logits = StateHeads(cfg, name="state_heads")(
            h, deterministic=deterministic)

        # Conflict detector, per (story, entity) track: Dense(dropout(h)) next to
        # Dense(dropout(s)), s the real state logits without gradient.
        drop = lambda y: nn.Dropout(cfg.projection_dropout)(y, deterministic=deterministic)
        logits = jax.lax.stop_gradient(real_state_logits(pre_logits, eff_logits,
                                                         NUM_CLASSES))
        projected = cells.tracks(nn.Dense(cfg.state_projection, name="states_proj")(drop(logits)))
        embedded = cells.tracks(nn.Dense(cfg.embedding_projection, name="embedding_proj")(
            drop(h)))
        # Joined per cell as [T*S, F] matrices (``_cells_of``), then per track.
        embedded, projected = _cells_of(embedded), _cells_of(projected)
        detector_input = jnp.concatenate([embedded, projected], axis=-1).reshape(
            *cells.track_mask.shape, -1)
        conflict_logits = ConflictDetector(cfg, self.max_sentences, name="detector")(
            detector_input, cells.track_mask, deterministic=deterministic)  # [T, S]

        # Story choice, from the beliefs on the grid.
        row_mask = cells.row_mask
        pre_logits, eff_logits = cells.to_grid(pre_logits), cells.to_grid(eff_logits)
        conflict_logits = cells.from_tracks(conflict_logits)
        conflict_prob = jax.nn.sigmoid(conflict_logits) * row_mask
        story_logits = -conflict_prob.sum(axis=(2, 3)) / 2  # −Σ_{e,s} p / 2, the reference's
        return {
            "pre_logits": pre_logits,
            "eff_logits": eff_logits,
            "pre_pred": _masked_argmax(pre_logits, row_mask),
            "eff_pred": _masked_argmax(eff_logits, row_mask),
            "conflict_logits": conflict_logits,
            "conflict_prob": conflict_prob,
            "story_logits": story_logits,
            "story_pred": jnp.argmax(story_logits, axis=-1).astype(jnp.int32),
        }

    def row_embeddings(self, batch: Mapping[str, jax.Array], deterministic: bool = True,
                       pieces: int = 1) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """From one encoder pass: rows float32 [R, H] (each row's first token, ``row_start``:
        flat n*L + l; read in ``pieces``, ``first_tokens``), row_index int32 [R] (each row's
        flat (B, 2, E, S) cell, B*2*E*S for a padding row), and the ``padding_row``'s vector
        float32 [H] (``PaddingRow.add_to``, one padding sequence a piece) or None."""
        inputs = {key: batch.get(key) for key in
                  ("input_ids", "attention_mask", "token_type_ids", "segment_ids")}
        row_start, extra = batch["row_start"], {}
        if self.padding_row is not None:
            inputs, row_start, extra = self.padding_row.add_to(inputs, row_start, pieces)
        hidden = self.encoder(inputs["input_ids"], inputs["attention_mask"],
                              token_type_ids=inputs["token_type_ids"],
                              deterministic=deterministic, segment_ids=inputs["segment_ids"],
                              **extra)
        rows = first_tokens(hidden, row_start, pieces)
        padding = None if self.padding_row is None else self.padding_row.vector(hidden)
        return rows, jnp.asarray(batch["row_index"], jnp.int32), padding


def first_tokens(hidden: jax.Array, row_start: jax.Array, pieces: int = 1) -> jax.Array:
    """hidden [N, L, H], row_start int [R] (flat n*L + l) -> the rows' tokens float32 [R, H].
    ``pieces`` > 1: N and R are that many equal pieces, each piece's rows starting in its own
    sequences (every layout builds a sharded batch so); each piece reads only its own, so a
    batch sharded in those pieces is read on its own devices (docs/compile.md#fsdp)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    row_start = jnp.asarray(row_start, jnp.int32)
    if pieces == 1:
        return flat[row_start].astype(jnp.float32)
    tokens = flat.shape[0] // pieces
    local = row_start.reshape(pieces, -1) - tokens * jnp.arange(pieces, dtype=jnp.int32)[:, None]
    rows = jnp.take_along_axis(flat.reshape(pieces, tokens, -1), local[..., None], axis=1)
    return rows.reshape(-1, flat.shape[-1]).astype(jnp.float32)


def _cells_of(values: jax.Array) -> jax.Array:
    """[T, S, F] -> [T*S, F]. The detector's inputs are joined in this shape, the one the
    model's results were first computed with: XLA may sum a gradient over [T*S] rows in another
    order than over [T, S], which changes the trained weights' last bits."""
    return values.reshape(-1, values.shape[-1])


def _masked_argmax(logits: jax.Array, row_mask: jax.Array) -> jax.Array:
    """Argmax over classes as int32, 0 on padded rows."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32) * row_mask[..., None]


def real_state_logits(pre_logits: jax.Array, eff_logits: jax.Array,
                      num_classes: tuple[int, ...]) -> jax.Array:
    """[N, A, C] twice -> [N, 2 Σ_a n_a]: the real classes' logits, preconditions first."""
    columns = real_logit_columns(num_classes)
    return jnp.concatenate([pre_logits.reshape(len(pre_logits), -1)[:, columns],
                            eff_logits.reshape(len(eff_logits), -1)[:, columns]], axis=-1)


def build_tiered_model(hf_config, config: TieredConfig = TieredConfig(), *, max_sentences: int,
                       dtype=jnp.float32, remat: bool = False, unroll: bool = False,
                       matmul_precision: str = "default") -> TieredModel:
    """The TieredModel of S = ``max_sentences`` around ``build_encoder(hf_config, dtype=,
    remat=, unroll=)`` (heads and detector in float32), the one place that reads
    ``padding_rows``, ``padding_row_*`` and ``cells`` (ValueError:
    ``padding_row_attention="legacy"`` for an encoder without ``mask_bias``)."""
    encoder = build_encoder(hf_config, dtype=dtype, remat=remat, unroll=unroll)
    padding_row = (PaddingRow.for_encoder(encoder, config.padding_row_length,
                                          config.padding_row_attention)
                   if config.padding_rows == "encoded" else None)
    return TieredModel(encoder=encoder, max_sentences=max_sentences, config=config,
                       matmul_precision=matmul_precision, padding_row=padding_row,
                       cell_view=GridCells if config.cells == "grid" else RealCells)
