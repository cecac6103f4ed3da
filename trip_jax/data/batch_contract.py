"""The batch contract: every array a batch and the model's outputs hold, in one table.

Dimensions ``B`` pairs, ``2`` stories, ``E`` entities, ``S`` sentences, ``A`` attributes, ``C``
classes, and each layout's encoder arrays (``Layout.fields``); ``INDEX_SPACES`` names the index
arrays; ``check_batch`` / ``check_outputs`` check one. Details: docs/reference.md#batch-contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from trip_jax.data import schema

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
    Field("story_logits", ("B", "2"), "float", "plausibility logit of each story"),
    Field("story_pred", ("B",), "int32", "index of the story predicted plausible"),
)
# Outputs an evaluation needs on the host (the logits stay on device).
PREDICTION_KEYS: tuple[str, ...] = ("pre_pred", "eff_pred", "conflict_prob", "story_pred",
                                    "story_logits")
# The logits decoding reads beyond the predictions (coherent decoding; the eval step returns
# them).
LOGIT_KEYS: tuple[str, ...] = ("pre_logits", "eff_logits", "conflict_logits")

FIXED_DIMS: dict[str, int] = {"2": 2, "A": schema.NUM_ATTRIBUTES, "C": schema.MAX_CLASSES}


class BatchContractError(ValueError):
    """An array is missing, unexpected, or has the wrong shape or dtype."""


# Index arrays: the flattened space each indexes. "cells": [B, 2, E, S]; "tracks": [B, 2, E];
# "tokens": the [N, L] encoder sequences. Entries at or past a space's end are padding.
INDEX_SPACES: dict[str, str] = {"row_index": "cells", "track_index": "tracks",
                                "row_start": "tokens"}


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


def check_batch(batch: Mapping[str, Any], encoder_fields: tuple[Field, ...], *,
                max_sentences: int | None = None) -> dict[str, int]:
    """Checks ``batch`` against ``encoder_fields`` (a layout's) and ``PAIR_FIELDS``; returns
    its named sizes (B, E, S, R, ...).

    Checks: every key, no unknown key, dtypes, ranks, sizes consistent across arrays,
    ``S == max_sentences`` when given, ``row_index`` within the grid with each real cell encoded
    exactly once and no encoder row on a padding cell unless every cell has one, ``row_start``
    within the sequences. Raises BatchContractError.
    """
    fields = [*encoder_fields, *PAIR_FIELDS]
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
    index = np.asarray(batch["row_index"])
    if index.size and (index.min() < 0 or index.max() > cells):
        raise BatchContractError(f"row_index outside 0..{cells}")
    real = index[index < cells]
    if np.unique(real).size != real.size:
        raise BatchContractError("row_index names a cell twice")
    row_mask = np.asarray(batch["row_mask"]).reshape(-1)
    if real.size < cells and not row_mask[real].all():
        # Only a layout that encodes every cell has rows on padding cells.
        raise BatchContractError("an encoder row sits on a padding cell")
    if np.flatnonzero(row_mask).size and not np.isin(np.flatnonzero(row_mask), real).all():
        raise BatchContractError("a real cell (row_mask True) has no encoder row")
    start = np.asarray(batch["row_start"])
    tokens = int(np.prod(np.shape(batch["input_ids"])))
    if start.size and (start.min() < 0 or start.max() >= tokens):
        raise BatchContractError(f"row_start outside 0..{tokens - 1}")
    pair_mask = np.asarray(batch["pair_mask"])
    if (np.asarray(batch["pair_index"])[pair_mask] < 0).any():
        raise BatchContractError("a real pair has a negative pair_index")
    return sizes


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


def zeros(sizes: Mapping[str, int], encoder_fields: tuple[Field, ...]
          ) -> dict[str, np.ndarray]:
    """A batch of zeros with ``encoder_fields`` and ``PAIR_FIELDS``, of the given sizes."""
    dims = {**FIXED_DIMS, **sizes}
    return {f.name: np.zeros(tuple(dims[d] for d in f.dims),
                             np.float32 if f.dtype == "float" else f.dtype)
            for f in (*encoder_fields, *PAIR_FIELDS)}


def describe(encoder_fields: Mapping[str, tuple[Field, ...]]) -> str:
    """The contract as a Markdown table: each layout's encoder fields (``{name: fields}``),
    then the pair fields and the model outputs (docs/reference.md, "Batch contract")."""
    lines = ["| Key | Shape | Dtype | Meaning |", "|---|---|---|---|"]
    tagged = [dataclasses.replace(f, meaning=f"{name}: {f.meaning}")
              for name, fields in encoder_fields.items() for f in fields]
    for f in (*tagged, *PAIR_FIELDS, *OUTPUT_FIELDS):
        lines.append(f"| `{f.name}` | [{', '.join(f.dims)}] | {f.dtype} | {f.meaning} |")
    return "\n".join(lines) + "\n"
