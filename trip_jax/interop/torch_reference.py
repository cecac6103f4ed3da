"""The reference training step in eager PyTorch, written from its semantics (docs/fidelity.md).

A baseline for parity (tests/test_exact_reference.py) and speed (benchmarks/torch_speed.py);
needs torch, and nothing else in trip_jax imports it.
Details: docs/fidelity.md#the-pytorch-reference-and-the-parity-test.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax
import numpy as np
import torch
import transformers
from torch import nn

from flax import traverse_util

from trip_jax.data import schema
from trip_jax.models import param_names
from trip_jax.models.tiered import class_mask
from trip_jax.reference.padding_row import LEGACY_MASK_BIAS


@dataclasses.dataclass(frozen=True)
class ReferenceConfig:
    """The numbers of the reference architecture (defaults: the paper's)."""

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
    detector_layer_norm_eps: float = 1e-5
    conflict_dropout: float = 0.1
    padding_row_length: int = 16

    @property
    def d_model(self) -> int:
        """Width of the detector."""
        return self.embedding_projection + self.state_projection

    @classmethod
    def from_tiered(cls, tiered, max_sentences: int) -> "ReferenceConfig":
        """The ReferenceConfig of a ``trip_jax.models.tiered.TieredConfig`` and S."""
        names = {f.name for f in dataclasses.fields(cls)} - {"max_sentences", "num_classes"}
        return cls(max_sentences=max_sentences, **{n: getattr(tiered, n) for n in names})


def legacy_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[N, T] 0/1 mask -> the 4D additive float mask [N, 1, T, T] of transformers 4.11."""
    n, t = attention_mask.shape
    bias = (1.0 - attention_mask[:, None, None, :].float()) * LEGACY_MASK_BIAS
    return bias.expand(n, 1, t, t)


class ClassificationHead(nn.Module):
    """A state head: dropout -> dense -> tanh -> dropout -> out_proj."""

    def __init__(self, hidden: int, num_labels: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, num_labels)

    def forward(self, x):
        """Logits [N, num_labels] of embeddings [N, hidden]."""
        x = torch.tanh(self.dense(self.dropout(x)))
        return self.out_proj(self.dropout(x))


class ReferenceModel(nn.Module):
    """The tiered model of the reference (module docstring), its modules named as the authors'
    (``trip_jax.models.param_names``)."""

    def __init__(self, hf_config: transformers.PretrainedConfig, config: ReferenceConfig):
        super().__init__()
        self.config = config
        hf_config._attn_implementation = "eager"
        self.embedding = transformers.AutoModel.from_config(
            hf_config, add_pooling_layer=False, attn_implementation="eager")
        hidden = hf_config.hidden_size
        self.precondition_classifiers, self.effect_classifiers = (nn.ModuleList([
            ClassificationHead(hidden, n, config.head_dropout) for n in config.num_classes])
            for _ in ("pre", "eff"))
        self.projection_dropout = nn.Dropout(config.projection_dropout)
        self.embedding_proj = nn.Linear(hidden, config.embedding_projection)
        self.states_proj = nn.Linear(2 * sum(config.num_classes), config.state_projection)
        self.detector_input_dropout = nn.Dropout(config.detector_input_dropout)
        layer = nn.TransformerEncoderLayer(
            config.d_model, config.detector_heads, config.detector_ff, config.detector_dropout,
            activation="relu", layer_norm_eps=config.detector_layer_norm_eps, batch_first=True,
            norm_first=False)
        self.detector = nn.TransformerEncoder(layer, config.detector_layers,
                                              enable_nested_tensor=False)
        self.conflict_dropout = nn.Dropout(config.conflict_dropout)
        self.decoder = nn.Linear(config.max_sentences * config.d_model, config.max_sentences)

    def encode(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        """Row embeddings [N, H]: position 0 of the last hidden state."""
        out = self.embedding(input_ids=input_ids.long(),
                           attention_mask=legacy_attention_mask(attention_mask),
                           token_type_ids=token_type_ids.long())
        return out.last_hidden_state[:, 0]

    def padding_row(self) -> torch.Tensor:
        """The embedding [H] of a padding cell's row: token ids 0, attention mask 0."""
        zeros = torch.zeros((1, self.config.padding_row_length), dtype=torch.long,
                            device=self.decoder.weight.device)
        return self.encode(zeros, zeros, zeros)[0]

    def forward_padded(self, input_ids, attention_mask, token_type_ids) -> dict:
        """The original's layout: inputs [B, 2, E, S, T] with every cell an encoder row."""
        grid = input_ids.shape[:4]
        h = self.encode(input_ids.reshape(-1, input_ids.shape[-1]),
                        attention_mask.reshape(-1, input_ids.shape[-1]),
                        token_type_ids.reshape(-1, input_ids.shape[-1]))
        cell_mask = attention_mask[..., 0].float()
        return self.forward_embeddings(h.reshape(*grid, -1), cell_mask)

    def forward_rows(self, input_ids, attention_mask, token_type_ids, row_index,
                     grid: tuple[int, int, int, int]) -> dict:
        """Real rows only: inputs [R, T] and their flat cell indices ``row_index`` [R] into
        ``grid`` (B, 2, E, S); every other cell gets the padding row's embedding."""
        h_rows = self.encode(input_ids, attention_mask, token_type_ids)
        cells = int(np.prod(grid))
        h = self.padding_row().expand(cells, -1).clone()
        h[row_index.long()] = h_rows
        cell_mask = torch.zeros(cells, device=h.device)
        cell_mask[row_index.long()] = 1.0
        return self.forward_embeddings(h.reshape(*grid, -1), cell_mask.reshape(grid))

    def forward_embeddings(self, h, cell_mask) -> dict:
        """Heads, detector and story choice from cell embeddings h [B, 2, E, S, H]."""
        cfg = self.config
        grid = h.shape[:4]
        flat = h.reshape(-1, h.shape[-1])
        logits = [head(flat) for head in (*self.precondition_classifiers,
                                          *self.effect_classifiers)]
        num_attributes = len(cfg.num_classes)
        pre, eff = logits[:num_attributes], logits[num_attributes:]
        states = torch.cat(pre + eff, dim=-1).detach()
        features = torch.cat([self.embedding_proj(self.projection_dropout(flat)),
                              self.states_proj(self.projection_dropout(states))], dim=-1)
        tracks = features.reshape(-1, cfg.max_sentences, cfg.d_model)
        x = self.detector(self.detector_input_dropout(tracks))
        x = self.conflict_dropout(x.reshape(x.shape[0], -1))
        conflict_logits = self.decoder(x).reshape(grid)
        conflict_prob = torch.sigmoid(conflict_logits) * cell_mask
        return {
            "pre_logits": [z.reshape(*grid, -1) for z in pre],
            "eff_logits": [z.reshape(*grid, -1) for z in eff],
            "conflict_logits": conflict_logits,
            "conflict_prob": conflict_prob,
            "story_logits": -conflict_prob.sum(dim=(2, 3)) / 2,
        }


def reference_losses(outputs: Mapping, labels: Mapping[str, torch.Tensor],
                     weights: tuple[float, float, float, float]) -> dict[str, torch.Tensor]:
    """The four losses over every cell of the grid and their weighted sum ("total")."""
    ce = nn.CrossEntropyLoss()

    def states(logits, label):
        return sum(ce(z.reshape(-1, z.shape[-1]), label[..., a].reshape(-1).long())
                   for a, z in enumerate(logits)) / len(logits)

    parts = {
        "pre": states(outputs["pre_logits"], labels["pre_label"]),
        "eff": states(outputs["eff_logits"], labels["eff_label"]),
        "conflict": nn.BCELoss()(outputs["conflict_prob"], labels["conflict_label"].float()),
        "story": ce(outputs["story_logits"], labels["story_label"].long()),
    }
    parts["total"] = sum(w * parts[k] for w, k in zip(weights, ("pre", "eff", "conflict",
                                                                "story")))
    return parts


class ReferenceAdamW(torch.optim.Optimizer):
    """transformers.AdamW (correct_bias=True): step_size = lr sqrt(1 - b2^t) / (1 - b1^t);
    p -= step_size m / (sqrt(v) + eps); then p -= lr weight_decay p."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient."""
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                state["step"] += 1
                t = state["step"]
                state["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                state["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                step_size = group["lr"] * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                p.addcdiv_(state["m"], state["v"].sqrt().add_(group["eps"]), value=-step_size)
                if group["weight_decay"] > 0:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])


def train_step(model: ReferenceModel, optimizer: torch.optim.Optimizer, forward,
               labels: Mapping[str, torch.Tensor], weights, clip_norm: float = 1.0) -> dict:
    """One reference step: ``forward()`` -> losses -> backward -> clip -> AdamW. Returns the
    outputs and losses (detached)."""
    optimizer.zero_grad()
    outputs = forward()
    parts = reference_losses(outputs, labels, weights)
    parts["total"].backward()
    if clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    detach = lambda x: [z.detach() for z in x] if isinstance(x, list) else x.detach()
    return {"outputs": {k: detach(v) for k, v in outputs.items()},
            "losses": {k: v.detach() for k, v in parts.items()}}


# ------------------------------------------------------------------------------------------
# Inputs from trip-jax batches, parameters from trip-jax parameter trees.

def padded_inputs(batch: Mapping[str, np.ndarray], pad_id: int, seq_len: int = 16
                  ) -> dict[str, torch.Tensor]:
    """The original's inputs [B, 2, E, S, seq_len] from a trip-jax dense batch: real rows as
    they are (padded with ``pad_id``), padding cells token ids 0 with attention mask 0. A row
    longer than ``seq_len`` is an error (cut rows when encoding: data.max_length)."""
    grid = batch["row_mask"].shape
    ids, mask, types = (np.asarray(batch[k]) for k in ("input_ids", "attention_mask",
                                                       "token_type_ids"))
    if mask[:, seq_len:].any():
        raise ValueError(f"a row is longer than {seq_len} tokens")
    width = min(ids.shape[1], seq_len)
    out = {"input_ids": np.full((len(ids), seq_len), pad_id, np.int64),
           "attention_mask": np.zeros((len(ids), seq_len), np.int64),
           "token_type_ids": np.zeros((len(ids), seq_len), np.int64)}
    for key, value in (("input_ids", ids), ("attention_mask", mask), ("token_type_ids", types)):
        out[key][:, :width] = value[:, :width]
        out[key][~np.asarray(batch["row_mask"], bool).reshape(-1)] = 0
    return {k: torch.as_tensor(v.reshape(*grid, seq_len)) for k, v in out.items()}


def row_inputs(batch: Mapping[str, np.ndarray]) -> dict:
    """The rows on real cells of a trip-jax dense batch: ids, masks, types [R, T], their cell
    indices and the grid."""
    grid = batch["row_mask"].shape
    index = np.asarray(batch["row_index"])
    cells = int(np.prod(grid))
    keep = (index < cells) & np.asarray(batch["row_mask"]).reshape(-1)[np.minimum(index,
                                                                                  cells - 1)]
    out = {k: torch.as_tensor(np.asarray(batch[k])[keep])
           for k in ("input_ids", "attention_mask", "token_type_ids", "row_index")}
    out["grid"] = tuple(int(g) for g in grid)
    return out


def label_tensors(batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The label arrays of a batch as tensors."""
    return {k: torch.as_tensor(np.asarray(batch[k]))
            for k in ("pre_label", "eff_label", "conflict_label", "story_label")}


def load_jax_params(model: ReferenceModel, params: Mapping) -> None:
    """Copies a trip-jax TieredModel parameter tree into ``model`` through the name table
    (``param_names.tiered_to_torch``); a parameter of ``model`` without a value, or a value
    without a parameter, is an error."""
    state = param_names.tiered_to_torch(traverse_util.flatten_dict(jax.device_get(params)),
                                        model.config.num_classes)
    expected = dict(model.named_parameters())
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:
        raise KeyError(f"no trip-jax parameter for {missing[:8]}; no torch parameter for "
                       f"{extra[:8]}")
    with torch.no_grad():
        for name, value in state.items():
            if tuple(expected[name].shape) != tuple(value.shape):
                raise ValueError(f"{name}: torch {tuple(expected[name].shape)}, "
                                 f"trip-jax {tuple(value.shape)}")
            expected[name].copy_(torch.as_tensor(np.array(value, np.float32)))


def torch_params_as_jax(model: ReferenceModel, like: Mapping) -> dict:
    """The torch parameters in the layout of the trip-jax tree ``like`` (for comparing after a
    step): the inverse of ``load_jax_params`` (``param_names.tiered_from_torch``); head
    columns a head lacks keep the values of ``like``."""
    like = traverse_util.flatten_dict(jax.device_get(like))
    tensors = {k: v.detach().numpy() for k, v in model.named_parameters()}
    flat, unused = param_names.tiered_from_torch(tensors, like, model.config.num_classes)
    missing = sorted("/".join(p) for p in like if p not in flat)
    if unused or missing:
        raise KeyError(f"torch parameters with no place: {unused[:8]}; trip-jax parameters "
                       f"not filled: {missing[:8]}")
    # [2A, C]: the columns each head (preconditions, then effects) lacks.
    lacking = ~np.tile(class_mask(model.config.num_classes), (2, 1))
    for leaf in ("kernel", "bias"):
        path = param_names.HEADS + ("out_proj", leaf)
        columns = lacking[:, None, :] if leaf == "kernel" else lacking
        flat[path] = np.where(columns, like[path], flat[path])
    return traverse_util.unflatten_dict(flat)



