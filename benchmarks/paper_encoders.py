"""Local encoder directories of the paper's encoders at their real shapes, with random weights.

``encoder_dir(name, num_layers=...)`` writes ``config.json`` (``PAPER_ENCODERS``) and PyTorch
``model.safetensors`` for ``--config.model.encoder=DIR``; no tokenizer (``stand_in_tokenizer``).
Details: benchmarks/README.md#the-code-file-by-file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from trip_jax.compile.encoders import PUBLISHED

# Published hyperparameters of the paper's encoders (their hub config.json files), with
# the keys that differ from the transformers config class's defaults (kept in
# trip_jax/compile/encoders.py, which --mode=compile reads).
PAPER_ENCODERS: dict[str, dict] = {
    "roberta": PUBLISHED["roberta-large"],
    "bert": PUBLISHED["bert-large-uncased"],
    "deberta": PUBLISHED["microsoft/deberta-base"],
}

_TRANSFORMERS_CLASSES = {"roberta": ("RobertaConfig", "RobertaModel"),
                         "bert": ("BertConfig", "BertModel"),
                         "deberta": ("DebertaConfig", "DebertaModel")}


def hf_config_values(name: str, num_layers: int | None = None,
                     overrides: dict | None = None) -> dict:
    """The config.json values of paper encoder ``name``, with ``num_layers`` layers if given
    and ``overrides`` (e.g. a small ``vocab_size`` for tests) set."""
    if name not in PAPER_ENCODERS:
        raise ValueError(f"unknown paper encoder {name!r}; expected one of "
                         f"{sorted(PAPER_ENCODERS)}")
    values = {**PAPER_ENCODERS[name], **(overrides or {})}
    if num_layers is not None:
        values["num_hidden_layers"] = int(num_layers)
    return values


def cache_root() -> Path:
    """Where the encoder directories are written."""
    return Path(tempfile.gettempdir()) / "trip_jax_paper_encoders"


def encoder_dir(name: str, num_layers: int | None = None, *, root: Path | None = None,
                seed: int = 0, overrides: dict | None = None) -> Path:
    """A directory under ``root`` (default ``cache_root()``) holding ``config.json`` and
    ``model.safetensors`` of paper encoder ``name`` (``hf_config_values``; random weights from
    ``seed``); written once, reused while its config and seed are the same."""
    values = hf_config_values(name, num_layers, overrides)
    directory = (root or cache_root()) / f"{name}-l{values['num_hidden_layers']}"
    stamp = directory / "written_from.json"
    wanted = json.dumps({"values": values, "seed": seed}, sort_keys=True)
    if stamp.is_file() and stamp.read_text() == wanted:
        return directory
    import torch
    import transformers

    config_cls, model_cls = (getattr(transformers, n) for n in _TRANSFORMERS_CLASSES[name])
    config = config_cls(**{k: v for k, v in values.items() if k != "model_type"})
    torch.manual_seed(seed)
    model = model_cls(config, add_pooling_layer=False) if name != "deberta" else model_cls(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    del model
    # Written last: a directory cut short while saving is rewritten by the next call.
    partial = stamp.with_name(stamp.name + f".{os.getpid()}")
    partial.write_text(wanted)
    partial.replace(stamp)
    return directory
