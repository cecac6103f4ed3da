"""The TRIP authors' pickled ``TieredModelPipeline`` (as ``torch_pickle.load`` returns it) ->
this project's model description and Flax parameter tree.

``read_pipeline(obj, source)`` returns an ``AuthorsModel``; ``to_params(model, expected)`` fills
the parameter tree exactly (only ``DROPPED`` tensors left out). Details: docs/convert.md.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import numpy as np

from trip_jax.data import schema
from trip_jax.interop.torch_pickle import NamedFunction, Record

Path_ = tuple[str, ...]

# Config classes (their last name component) -> model_type of the encoders built here.
FAMILIES = {"BertConfig": "bert", "RobertaConfig": "roberta"}
_REFUSED_FAMILIES = {
    "DebertaConfig": "DeBERTa v1: its relative-attention weights are not mapped onto this "
                     "project's DeBERTa encoder with certainty (no tested correspondence)",
    "DebertaV2Config": "DeBERTa v2: the authors' models do not use it and no mapping is tested",
}
# Fields of the pickled encoder config that decide the architecture (the rest is training or
# generation settings).
_CONFIG_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "hidden_act", "hidden_dropout_prob",
                  "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
                  "initializer_range", "layer_norm_eps", "pad_token_id", "bos_token_id",
                  "eos_token_id", "position_embedding_type")
# Tensors the authors' model holds but its forward pass (with the "attributes" ablation) never
# uses: the attribute classifier, the encoder's pooler and its position / token-type id buffers.
DROPPED = (re.compile(r"^attribute_classifier\."), re.compile(r"^embedding\.pooler\."),
           re.compile(r"^embedding\.embeddings\.(position_ids|token_type_ids)$"))
# The ablation of the model the paper reports: no attribute gating, state logits (not labels)
# into the detector, embeddings and states both used.
REQUIRED_ABLATION = ("attributes", "states-logits")
# Ablation entries that change only training (teacher forcing of states into the detector).
TRAINING_ONLY_ABLATION = ("states-teacher-forcing",)
_ACTIVATIONS = {"torch.nn.functional.relu": "relu", "torch.nn.functional.gelu": "gelu",
                "torch._C._nn.gelu": "gelu"}


class AuthorsModelError(ValueError):
    """The pickled object is not an authors' model this project can run (one line)."""


@dataclasses.dataclass
class AuthorsModel:
    """What the pickle holds, in this project's terms."""

    model_type: str                     # "bert" or "roberta"
    encoder_config: dict[str, Any]      # Hugging Face config fields (model_type excluded)
    name_or_path: str                   # the encoder's hub name the authors loaded, or ""
    tiered: dict[str, Any]              # model.tiered keys read from the pickle
    max_sentences: int
    loss_weights: tuple[float, float, float, float]   # pre, eff, conflict, story
    ablation: tuple[str, ...]
    tensors: dict[str, np.ndarray]      # every tensor by PyTorch name, DROPPED ones removed
    dropped: tuple[str, ...]


def _modules(record: Record) -> dict[str, Any]:
    return dict(record.get("_modules") or {})


def _flat_tensors(record: Record, prefix: str = "") -> dict[str, np.ndarray]:
    """Every parameter and buffer under ``record``, by dotted PyTorch name."""
    out = {}
    for kind in ("_parameters", "_buffers"):
        for name, value in (record.get(kind) or {}).items():
            if value is not None:
                out[prefix + name] = np.asarray(value)
    for name, child in _modules(record).items():
        if isinstance(child, Record):
            out.update(_flat_tensors(child, f"{prefix}{name}."))
    return out


def _listing(names, limit: int = 6) -> str:
    names = list(names)
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def read_pipeline(obj: Any, source: str) -> AuthorsModel:
    """The ``AuthorsModel`` of a pickled TieredModelPipeline (module docstring)."""
    if not isinstance(obj, Record):
        kind = "a state dict" if isinstance(obj, Mapping) else type(obj).__name__
        raise AuthorsModelError(
            f"{source}: holds {kind}, not a whole pickled model; the authors' notebook saves "
            "the model with torch.save(model, path), which is what this command reads")
    modules = _modules(obj)
    if not {"precondition_classifiers", "effect_classifiers"} <= set(modules):
        raise AuthorsModelError(
            f"{source}: holds a {obj.qualname} without precondition/effect state heads "
            "(precondition_classifiers, effect_classifiers): not the authors' tiered TRIP model")
    encoder = modules.get("embedding")
    if not isinstance(encoder, Record) or not isinstance(encoder.get("config"), Record):
        raise AuthorsModelError(f"{source}: the model's 'embedding' is not a Hugging Face "
                                "encoder with a config")
    hf = encoder["config"]
    family = FAMILIES.get(hf.class_name)
    if family is None:
        why = _REFUSED_FAMILIES.get(hf.class_name, f"supported: {', '.join(FAMILIES)}")
        raise AuthorsModelError(f"{source}: unsupported encoder family {hf.qualname} ({why})")
    fields = {k: hf.state[k] for k in _CONFIG_FIELDS if k in hf.state}
    kind = fields.get("position_embedding_type") or "absolute"
    if kind != "absolute":
        raise AuthorsModelError(f"{source}: encoder position_embedding_type={kind!r} is not "
                                "supported (only 'absolute')")
    ablation = tuple(obj.get("ablation") or ())
    _check_ablation(ablation, source)
    num_sents = int(obj.get("num_sents", 0) or 0)
    labels = obj.get("labels_per_att") or {}
    found = tuple(int(labels[i]) for i in sorted(labels))
    if found != schema.NUM_CLASSES:
        raise AuthorsModelError(f"{source}: labels_per_att gives {found} classes per attribute; "
                                f"this project's attributes have {schema.NUM_CLASSES}")
    if obj.get("encoding_pad_zeros", 0):
        raise AuthorsModelError(f"{source}: the detector input is padded with "
                                f"{obj.get('encoding_pad_zeros')} zeros; not supported")
    weights_ = list(obj.get("loss_weights") or [])
    if len(weights_) != 5:
        raise AuthorsModelError(f"{source}: loss_weights {weights_!r} is not the authors' "
                                "[attributes, preconditions, effects, conflicts, stories]")
    tensors = _flat_tensors(obj)
    dropped = tuple(sorted(n for n in tensors if any(p.search(n) for p in DROPPED)))
    for name in dropped:
        del tensors[name]
    return AuthorsModel(
        model_type=family, encoder_config=fields,
        name_or_path=str(hf.state.get("_name_or_path") or ""),
        tiered=_tiered_keys(modules, tensors, source), max_sentences=num_sents,
        loss_weights=tuple(float(w) for w in weights_[1:]), ablation=ablation,
        tensors=tensors, dropped=dropped)


def _check_ablation(ablation: tuple[str, ...], source: str) -> None:
    missing = [a for a in REQUIRED_ABLATION if a not in ablation]
    other = [a for a in ablation if a not in REQUIRED_ABLATION + TRAINING_ONLY_ABLATION]
    if missing or other:
        raise AuthorsModelError(
            f"{source}: ablation {list(ablation)} is not the paper's tiered model "
            f"({list(REQUIRED_ABLATION)}, optionally {list(TRAINING_ONLY_ABLATION)}); "
            f"{'missing ' + str(missing) if missing else 'unsupported ' + str(other)}")


def _tiered_keys(modules: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
                 source: str) -> dict[str, Any]:
    """The model.tiered keys the pickle determines (sizes from shapes, the rest from the
    detector layers' attributes)."""
    try:
        layers = _modules(_modules(modules["detector"])["layers"])
        first = layers["0"]
        attention = _modules(first)["self_attn"]
        norm = _modules(first)["norm1"]
        activation = first.get("activation")
        name = activation.qualname if isinstance(activation, NamedFunction) else activation
        if name not in _ACTIVATIONS:
            raise AuthorsModelError(f"{source}: detector activation {name!r} is not supported")
        return {
            "embedding_projection": int(tensors["embedding_proj.weight"].shape[0]),
            "state_projection": int(tensors["states_proj.weight"].shape[0]),
            "detector_layers": len(layers),
            "detector_heads": int(attention["num_heads"]),
            "detector_ff": int(tensors["detector.layers.0.linear1.weight"].shape[0]),
            "detector_layer_norm_eps": float(norm["eps"]),
            "detector_activation": _ACTIVATIONS[name],
            "detector_norm_first": bool(first.get("norm_first", False)),
        }
    except (KeyError, TypeError, AttributeError) as err:
        raise AuthorsModelError(f"{source}: the conflict detector or its projections are not "
                                f"the authors' (missing {err})") from None


def hf_config(model: AuthorsModel):
    """The Hugging Face config of the pickled encoder."""
    from trip_jax.models.builders import encoder_config_from_dict

    return encoder_config_from_dict({"model_type": model.model_type, **model.encoder_config})


# ------------------------------------------------------------------------------------------
# Tensors -> the flat parameter tree.

def to_params(model: AuthorsModel, expected: Mapping[Path_, Any], source: str
              ) -> dict[Path_, np.ndarray]:
    """Every leaf of ``expected`` (flat path -> shape-carrying leaf) filled from the pickled
    tensors (float32). AuthorsModelError naming any tensor with no place, any leaf left
    unfilled, or a shape that differs."""
    from trip_jax.models import param_names  # with the encoder's conversion: after reading

    tensors = dict(model.tensors)
    flat: dict[Path_, np.ndarray] = {}
    _encoder(tensors, expected, flat, source)
    rest = {p: v for p, v in expected.items() if p[0] != "encoder"}
    try:
        found, unused = param_names.tiered_from_torch(tensors, rest, schema.NUM_CLASSES)
    except ValueError as err:
        raise AuthorsModelError(f"{source}: {str(err).splitlines()[0]}") from None
    flat.update(found)
    tensors = {n: tensors[n] for n in unused}
    if tensors:
        raise AuthorsModelError(f"{source}: tensors with no place in this project's model: "
                                f"{_listing(sorted(tensors))}")
    unfilled = sorted("/".join(p) for p in expected if p not in flat)
    if unfilled:
        raise AuthorsModelError(f"{source}: parameters the file does not fill: "
                                f"{_listing(unfilled)}")
    wrong = [f"{'/'.join(p)}: file {flat[p].shape}, model {tuple(expected[p].shape)}"
             for p in expected if tuple(flat[p].shape) != tuple(expected[p].shape)]
    if wrong:
        raise AuthorsModelError(f"{source}: shape mismatch: {_listing(wrong, 3)}")
    return flat


def _encoder(tensors: dict[str, np.ndarray], expected: Mapping[Path_, Any],
             flat: dict[Path_, np.ndarray], source: str) -> None:
    """The encoder's tensors (``embedding.*``) through the Hugging Face renaming of
    ``trip_jax.models.weights``, layers stacked (``param_names``)."""
    from trip_jax.models import param_names, weights  # jax and flax: only once read

    prefix = param_names.ENCODER
    names = [n for n in tensors if n.startswith(prefix)]
    checkpoint = {tuple(n[len(prefix):].split(".")): tensors.pop(n) for n in names}
    inner = {p[1:]: v for p, v in expected.items() if p[0] == "encoder"}
    try:
        params, report = weights.convert_checkpoint(checkpoint, inner, strict=True,
                                                    source=source)
    except ValueError as err:
        raise AuthorsModelError(str(err).splitlines()[0]) from None
    if report.unused:
        raise AuthorsModelError(f"{source}: encoder tensors with no place in this project's "
                                f"encoder: {_listing(prefix + n for n in report.unused)}")
    params = param_names.stack_layers(params)
    flat.update({("encoder",) + p: np.asarray(v, np.float32) for p, v in params.items()})
