"""Device memory of the paper configs' train step at batch B, from XLA's memory plans.

Input: the case records of a ``benchmarks.run --paper`` run (``benchmarks.train_speed``): the
model ``M`` (``M_lN``: N layers) timed at batch 1 (its train step's plan: ``temp_bytes``, and the
train state's sizes), and XLA's plans of the train step of ``M_l1`` and ``M_l2`` (1 and 2
layers, the real widths) on the largest batch at each batch size and dtype.

The estimate for L layers, batch B, dtype d (``FORMULA``):

    memory(B, d) = state + batch(B) + temp_l2(B, d) + (L - 2) * layer(B, d)
    layer(B, d) = temp_l2(B, d) - temp_l1(B, d)

``state``: the parameters and the AdamW state (float32 whatever the compute dtype, as
measured: ``state.param_bytes + state.opt_state_bytes``); ``batch``: the batch's arrays;
``temp``: XLA's temporary buffers of the step (activations kept for the backward pass,
gradients, the optimizer's intermediates); ``layer``: what one more encoder layer adds to them
(its activations, proportional to the encoder tokens of the largest batch at B, and its
gradients). The train step donates the state, so its outputs take no memory beyond it.
``check``: the formula at the full depth over the full-size model's own measured plan (the
timed case: batch 1, float32).
"""

from __future__ import annotations

import re

FORMULA = ("memory(B, d) = state + batch(B) + temp_l2(B, d) + (L - 2) * (temp_l2(B, d) - "
           "temp_l1(B, d)); state = parameters + AdamW state (float32), temp = XLA's "
           "temporary buffers of the train step (activations, gradients, optimizer "
           "intermediates) of the 1- and 2-layer variants on the largest batch at B")


def _plans(cases: list[dict], model: str, dtype: str) -> tuple[int, dict[int, dict]]:
    """(state bytes, {batch size: memory plan}) of ``model`` at ``dtype`` (its plan case)."""
    for case in cases:
        if ("error" not in case and case["model"] == model and case["dtype"] == dtype
                and case.get("memory_plans")):
            plans = {p["batch_size"]: p for p in case.get("memory_plans", [])}
            return case["state"]["param_bytes"] + case["state"]["opt_state_bytes"], plans
    return 0, {}


def estimates(cases: list[dict]) -> list[dict]:
    """One entry per (full-size model, dtype, batch size) with the plans it needs: its
    tokens, state, activations (temp) and total in bytes, per pair, and the check."""
    result = []
    for full in cases:
        if "error" in full or "train" not in full or full.get("layout") != "config":
            continue
        name, layers = full["model"], full["encoder"]["num_hidden_layers"]
        base = re.sub(r"_l\d+$", "", name)
        state = full["state"]["param_bytes"] + full["state"]["opt_state_bytes"]
        for dtype in ("float32", "bfloat16"):
            _, one = _plans(cases, f"{base}_l1", dtype)
            state_two, two = _plans(cases, f"{base}_l2", dtype)
            check = None
            if dtype == full["dtype"] and 1 in one and 1 in two:
                predicted = two[1]["train"]["temp_bytes"] + (layers - 2) * (
                    two[1]["train"]["temp_bytes"] - one[1]["train"]["temp_bytes"])
                check = predicted / full["train"]["temp_bytes"]
            for batch_size, plan in sorted(two.items()):
                if batch_size not in one:
                    continue
                tokens = plan["batch"]["encoder_tokens"]
                layer = plan["train"]["temp_bytes"] - one[batch_size]["train"]["temp_bytes"]
                batch_bytes = plan["train"]["argument_bytes"] - state_two
                temp = plan["train"]["temp_bytes"] + (layers - 2) * layer
                total = state + batch_bytes + temp
                result.append({
                    "model": name, "layers": layers, "dtype": dtype, "batch_size": batch_size,
                    "pairs": plan["batch"]["pairs"], "encoder_tokens": tokens,
                    "grid_cells": plan["batch"]["grid_slots"], "state_bytes": state,
                    "batch_bytes": batch_bytes, "layer_bytes": layer,
                    "temp_bytes": temp, "total_bytes": total,
                    "bytes_per_pair": total / plan["batch"]["pairs"],
                    "check_full_over_measured": check if batch_size == 1 else None})
    return result


def markdown_rows(entries: list[dict]) -> list[list]:
    """Table rows (GiB) of ``estimates``."""
    gib = 2 ** 30
    return [[e["model"], e["dtype"], e["batch_size"], f"{e['encoder_tokens']:,}",
             f"{e['layer_bytes'] / gib:.2f}", f"{e['state_bytes'] / gib:.1f}",
             f"{e['temp_bytes'] / gib:.1f}", f"{e['total_bytes'] / gib:.1f}",
             f"{e['bytes_per_pair'] / gib:.2f}",
             "-" if e["check_full_over_measured"] is None
             else f"{e['check_full_over_measured']:.2f}"] for e in entries]


HEADER = ["model", "dtype", "B", "encoder tokens", "GiB per layer", "state GiB",
          "activations GiB", "total GiB", "GiB per pair", "check"]
