"""The batch contract: every array a batch and the model's outputs hold, in one table.

Named dimensions:

- ``B`` pairs in the batch (this process's share of the global batch), ``2`` stories per pair,
  ``E`` entity slots per story, ``S`` sentence slots (``data.max_sentences``), ``A`` the 20
  attributes (``schema.ATTRIBUTES``), ``C`` classes per attribute head (``schema.MAX_CLASSES``);
- ``R`` encoder rows and ``T`` tokens per row of the main row group; ``R_short`` and
  ``T_short`` the same for the optional group of short rows (``data.short_seq_len``);
- packed_tokens layout: ``N`` packed sequences of ``P`` tokens (``data.pack_length``), ``R``
  rows (segments of those sequences) and ``K`` (story, entity) tracks.

Every (pair, story, entity, sentence) cell of the ``[B, 2, E, S]`` grid is one encoder row, real
or padding. The encoder sees only the rows of the row groups: in the packed layout the real
rows (rounded up with padding rows), in the dense layout every cell (``R == B*2*E*S``).
``row_index`` places each encoder row in the flattened grid; a padding row of the packed layout
points one past its end (``B*2*E*S``). Producers: ``data.features.build_batch`` (through
``data.batching`` and ``trip_jax.input_pipeline``), ``builders.example_batch`` and
``sharding.pad_rows``; consumers: the model, the losses, the train and eval steps, the evaluator.
``check_batch`` and ``check_outputs`` check an instance against the table (tests call them on
every producer). docs/reference.md, section "Batch contract", explains the layouts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from trip_jax import schema

# Prefixes of the encoder row groups: "" the main group (always there), "short_" the optional
# group of short rows.
ROW_GROUPS: tuple[str, ...] = ("", "short_")


@dataclasses.dataclass(frozen=True)
class Field:
    """One array of the contract: its name, named dimensions, dtype kind and meaning."""

    name: str
    dims: tuple[str, ...]
    dtype: str          # "int32", "bool" or "float" (any floating dtype)
    meaning: str

    def matches_dtype(self, dtype: np.dtype) -> bool:
        """Whether an array of ``dtype`` is acceptable for this field."""
        if self.dtype == "float":
            return np.issubdtype(dtype, np.floating)
        return np.dtype(dtype) == np.dtype(self.dtype)


# Encoder arrays of one row group; the short group has the same keys with "short_" in front
# and dimensions (R_short, T_short).
ROW_FIELDS: tuple[Field, ...] = (
    Field("input_ids", ("R", "T"), "int32", "token ids of each row: the entity, then the "
          "sentence (tokenizer sentence-pair encoding); padding tokens hold the pad id"),
    Field("attention_mask", ("R", "T"), "int32", "1 on real tokens; padding rows attend to "
          "their first token only, so that no row is fully masked"),
    Field("token_type_ids", ("R", "T"), "int32", "segment ids (0 entity, 1 sentence for "
          "BERT-style tokenizers; all 0 for tokenizers without them)"),
    Field("row_index", ("R",), "int32", "flat index of the row's cell in the [B, 2, E, S] "
          "grid; B*2*E*S for a padding row of the packed layout"),
)
ROW_KEYS: tuple[str, ...] = tuple(f.name for f in ROW_FIELDS)

# Encoder arrays of the packed_tokens layout: rows concatenated into sequences, one segment each.
PACKED_TOKEN_FIELDS: tuple[Field, ...] = (
    Field("input_ids", ("N", "P"), "int32", "packed sequences of row tokens; padding tokens "
          "hold the pad id"),
    Field("attention_mask", ("N", "P"), "int32", "1 on real tokens (segment_ids > 0)"),
    Field("token_type_ids", ("N", "P"), "int32", "each row's segment ids, as in the row layouts"),
    Field("segment_ids", ("N", "P"), "int32", "k >= 1 on the tokens of the k-th row of the "
          "sequence, 0 on padding: tokens attend within their segment, positions restart there"),
    Field("row_start", ("R",), "int32", "flat index n*P + p of each row's first token (0 for "
          "padding rows)"),
    Field("row_index", ("R",), "int32", "flat index of the row's cell in the [B, 2, E, S] grid; "
          "B*2*E*S for a padding row"),
    Field("track_index", ("K",), "int32", "flat index into the [B, 2, E] tracks of each track "
          "with a real row, once (ascending within each device's piece of the batch); B*2*E "
          "for padding entries"),
)

# Per-pair arrays: the grid of cells, labels and bookkeeping.
PAIR_FIELDS: tuple[Field, ...] = (
    Field("row_mask", ("B", "2", "E", "S"), "bool", "True where the cell is a real (entity, "
          "sentence) row of the story"),
    Field("pre_label", ("B", "2", "E", "S", "A"), "int32", "gold precondition class of each "
          "attribute (0 on padding cells)"),
    Field("eff_label", ("B", "2", "E", "S", "A"), "int32", "gold effect class of each "
          "attribute (0 on padding cells)"),
    Field("conflict_label", ("B", "2", "E", "S"), "int32", "1 at the evidence and breakpoint "
          "sentences of the implausible story's conflicting entities, else 0"),
    Field("story_label", ("B",), "int32", "index (0 or 1) of the plausible story"),
    Field("pair_mask", ("B",), "bool", "False for padding pairs (end of an epoch)"),
    Field("pair_index", ("B",), "int32", "index of the pair in the encoded list the batch was "
          "built from; -1 for padding pairs"),
)
PAIR_KEYS: tuple[str, ...] = tuple(f.name for f in PAIR_FIELDS)

# What the model returns for a batch (``models.tiered.TieredModel``).
OUTPUT_FIELDS: tuple[Field, ...] = (
    Field("pre_logits", ("B", "2", "E", "S", "A", "C"), "float", "precondition logits; "
          "classes beyond an attribute's count hold a large negative value"),
    Field("eff_logits", ("B", "2", "E", "S", "A", "C"), "float", "effect logits (as above)"),
    Field("pre_pred", ("B", "2", "E", "S", "A"), "int32", "argmax precondition class, 0 on "
          "padding cells"),
    Field("eff_pred", ("B", "2", "E", "S", "A"), "int32", "argmax effect class, 0 on padding "
          "cells"),
    Field("conflict_logits", ("B", "2", "E", "S"), "float", "conflict logits (pre-sigmoid)"),
    Field("conflict_prob", ("B", "2", "E", "S"), "float", "conflict beliefs, 0 on padding "
          "cells; >= 0.5 counts as a predicted conflicting sentence"),
    Field("story_score", ("B", "2"), "float", "plausibility score of each story"),
    Field("story_pred", ("B",), "int32", "index of the story predicted plausible"),
)
# Outputs an evaluation needs on the host (the logits stay on device).
PREDICTION_KEYS: tuple[str, ...] = ("pre_pred", "eff_pred", "conflict_prob", "story_pred",
                                    "story_score")

FIXED_DIMS: dict[str, int] = {"2": 2, "A": schema.NUM_ATTRIBUTES, "C": schema.MAX_CLASSES}


class BatchContractError(ValueError):
    """An array is missing, unexpected, or has the wrong shape or dtype."""


def is_packed_tokens(batch: Mapping[str, Any]) -> bool:
    """Whether ``batch`` is in the packed_tokens layout (its rows are segments of sequences)."""
    return "segment_ids" in batch


def row_groups(batch: Mapping[str, Any]) -> list[str]:
    """Key prefixes of the encoder row groups present in a packed or dense ``batch`` (main group
    first); [] for the packed_tokens layout, which has no [R, T] row arrays."""
    if is_packed_tokens(batch):
        return []
    return [prefix for prefix in ROW_GROUPS if prefix + "input_ids" in batch]


def batch_fields(groups: tuple[str, ...] | list[str] = ("",)) -> list[Field]:
    """The fields of a batch with the given row groups (short-group dims renamed)."""
    fields = []
    for prefix in groups:
        for f in ROW_FIELDS:
            dims = tuple(f"{d}_short" if prefix else d for d in f.dims)
            fields.append(dataclasses.replace(f, name=prefix + f.name, dims=dims))
    return fields + list(PAIR_FIELDS)


def _check_fields(arrays: Mapping[str, Any], fields: list[Field], sizes: dict[str, int],
                  what: str) -> dict[str, int]:
    """Checks dtype, rank and named sizes of ``fields`` in ``arrays``; returns the sizes."""
    for f in fields:
        value = arrays[f.name]
        # Arrays, or shape-dtype structures (jax.eval_shape) for a check without computing.
        shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
        dtype = value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype
        if not f.matches_dtype(dtype):
            raise BatchContractError(f"{what} {f.name!r} has dtype {dtype}, expected {f.dtype}")
        if len(shape) != len(f.dims):
            raise BatchContractError(f"{what} {f.name!r} has shape {shape}, expected "
                                     f"[{', '.join(f.dims)}]")
        for dim, size in zip(f.dims, shape):
            expected = FIXED_DIMS.get(dim, sizes.get(dim))
            if expected is None:
                sizes[dim] = size
            elif size != expected:
                raise BatchContractError(
                    f"{what} {f.name!r} has shape {shape}: dimension {dim} is {size}, "
                    f"expected {expected} ([{', '.join(f.dims)}])")
    return sizes


def check_batch(batch: Mapping[str, Any], *, max_sentences: int | None = None,
                layout: str | None = None) -> dict[str, int]:
    """Checks ``batch`` against the contract; returns its named sizes (B, E, S, R, T, ...).

    Checks: every required key, no unknown key, dtypes, ranks, sizes consistent across arrays,
    ``S == max_sentences`` when given, ``row_index`` within the grid (and each real cell encoded
    exactly once), ``R == B*2*E*S`` for ``layout="dense"``. Raises BatchContractError.
    """
    groups = row_groups(batch)
    if is_packed_tokens(batch):
        fields = [*PACKED_TOKEN_FIELDS, *PAIR_FIELDS]
    elif "" not in groups:
        raise BatchContractError("batch has no 'input_ids' (the main row group)")
    else:
        fields = batch_fields(groups)
    names = {f.name for f in fields}
    missing = sorted(names - set(batch))
    unknown = sorted(set(batch) - names)
    if missing or unknown:
        raise BatchContractError(f"batch keys differ from the contract: missing {missing}, "
                                 f"unknown {unknown}")
    sizes = _check_fields(batch, fields, {}, "batch array")
    if max_sentences is not None and sizes["S"] != max_sentences:
        raise BatchContractError(f"batch has S={sizes['S']}, expected max_sentences="
                                 f"{max_sentences}")
    cells = sizes["B"] * 2 * sizes["E"] * sizes["S"]
    if layout == "dense" and (groups != [""] or sizes["R"] != cells):
        raise BatchContractError(f"a dense batch has one row group of B*2*E*S={cells} rows, "
                                 f"got R={sizes['R']} and groups {groups}")
    if layout == "packed_tokens" and not is_packed_tokens(batch):
        raise BatchContractError("a packed_tokens batch has segment_ids")
    if is_packed_tokens(batch):
        _check_packed_tokens(batch, sizes)
    index = np.concatenate([np.asarray(batch[p + "row_index"]) for p in groups or [""]])
    if index.size and (index.min() < 0 or index.max() > cells):
        raise BatchContractError(f"row_index outside 0..{cells}")
    real = index[index < cells]
    if np.unique(real).size != real.size:
        raise BatchContractError("row_index names a cell twice")
    row_mask = np.asarray(batch["row_mask"]).reshape(-1)
    if real.size < cells and not row_mask[real].all():
        # Only the dense layout (every cell a row) encodes padding cells.
        raise BatchContractError("an encoder row of the packed layout sits on a padding cell")
    if np.flatnonzero(row_mask).size and not np.isin(np.flatnonzero(row_mask), real).all():
        raise BatchContractError("a real cell (row_mask True) has no encoder row")
    pair_mask = np.asarray(batch["pair_mask"])
    if (np.asarray(batch["pair_index"])[pair_mask] < 0).any():
        raise BatchContractError("a real pair has a negative pair_index")
    return sizes


def _check_packed_tokens(batch: Mapping[str, Any], sizes: Mapping[str, int]) -> None:
    """The packed_tokens checks of ``check_batch``: rows start on their own segment's first
    token, and ``track_index`` lists exactly the tracks with real rows."""
    segments = np.asarray(batch["segment_ids"]).reshape(-1)
    start = np.asarray(batch["row_start"])
    real = np.asarray(batch["row_index"]) < sizes["B"] * 2 * sizes["E"] * sizes["S"]
    if start.size and (start.min() < 0 or start.max() >= segments.size):
        raise BatchContractError(f"row_start outside 0..{segments.size - 1}")
    first = start[real]
    if (segments[first] == 0).any() or ((first % sizes["P"] > 0)
                                        & (segments[first - 1] == segments[first])).any():
        raise BatchContractError("a row_start is not the first token of a segment")
    if not np.array_equal(np.asarray(batch["attention_mask"]).reshape(-1), segments > 0):
        raise BatchContractError("attention_mask differs from segment_ids > 0")
    row_mask = np.asarray(batch["row_mask"])
    num_tracks = row_mask.size // row_mask.shape[-1]
    tracks = np.asarray(batch["track_index"])
    expected = np.flatnonzero(row_mask.reshape(num_tracks, -1).any(axis=-1))
    listed = tracks[tracks != num_tracks]
    if not np.array_equal(np.sort(listed), expected):
        raise BatchContractError("track_index does not list each track with real rows exactly "
                                 "once (other entries: B*2*E)")


def check_outputs(outputs: Mapping[str, Any], batch_sizes: Mapping[str, int]
                  ) -> dict[str, int]:
    """Checks model ``outputs`` against the contract for a batch of ``batch_sizes`` (the
    result of ``check_batch``); returns the sizes (with C). Raises BatchContractError."""
    names = [f.name for f in OUTPUT_FIELDS]
    missing = sorted(set(names) - set(outputs))
    if missing:
        raise BatchContractError(f"model outputs lack {missing}")
    sizes = {k: v for k, v in batch_sizes.items() if k in ("B", "E", "S")}
    return _check_fields(outputs, list(OUTPUT_FIELDS), sizes, "model output")


def zeros(sizes: Mapping[str, int], groups: tuple[str, ...] = ("",)) -> dict[str, np.ndarray]:
    """A batch of zeros with the contract's keys, dtypes and the given named sizes."""
    dims = {**FIXED_DIMS, **sizes}
    return {f.name: np.zeros(tuple(dims[d] for d in f.dims),
                             np.float32 if f.dtype == "float" else f.dtype)
            for f in batch_fields(groups)}


def describe() -> str:
    """The contract as a Markdown table (for docs/reference.md, section "Batch contract")."""
    lines = ["| Key | Shape | Dtype | Meaning |", "|---|---|---|---|"]
    packed_tokens = [dataclasses.replace(f, meaning="packed_tokens: " + f.meaning)
                     for f in PACKED_TOKEN_FIELDS]
    for f in (*ROW_FIELDS, *packed_tokens, *PAIR_FIELDS, *OUTPUT_FIELDS):
        lines.append(f"| `{f.name}` | [{', '.join(f.dims)}] | {f.dtype} | {f.meaning} |")
    return "\n".join(lines) + "\n"
