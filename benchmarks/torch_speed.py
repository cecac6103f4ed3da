"""Times the eager PyTorch reference step (``benchmarks/torch_reference.py``) on the pairs that
the trip-jax cases time: the same-run baseline of every benchmark table.

A case runs in its own process (``benchmarks.run`` starts one per case) so that its peak memory
is its own. Layouts:

- ``torch_padded``: as the reference ran. The pairs are encoded as the reference encoded them
  (rows cut at 16 tokens, token types zero), padded to the data's largest entity count x 7
  sentences x 16 tokens, and every cell of that grid is an encoder row
  (``ReferenceModel.forward_padded``).
- ``torch_rows``: only the real rows of trip-jax's packed batch of the same pairs, at the same
  token length T, plus the one padding row whose vector fills the padding cells
  (``ReferenceModel.forward_rows``).

Batches: ``batch_size`` pairs picked as the trip-jax cases pick them
(``harness.representative_indices``), batched into one torch step over their (B, 2, E, S) grid
(``"pairs_per_step": "batched"`` in the record). Steps: train = forward + the four losses +
backward + ``clip_grad_norm_`` + transformers-style AdamW with the config's learning rate,
betas, eps, weight decay, clip norm and loss weights (``torch_reference.train_step``); eval =
forward in eval mode under ``torch.no_grad()``. Each mode runs ``warmup`` untimed steps, then
``iters`` timed ones (steady state = their median). Eval runs before train, as in
``benchmarks.train_speed``. Weights are torch's random initialisation: a step's cost does not
depend on their values. Threads: ``torch.set_num_threads(os.cpu_count())``, with
``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it: torch's OpenMP threads otherwise
spin at every barrier, and on a CPU shared with any other process one descheduled thread stalls
the rest (the tiny model's eval step measured 0.6-2.1 s instead of 0.09 s at a load average of
4 on 2 cores). The record says which policy ran (``omp_wait_policy``).

    python -m benchmarks.torch_speed --case '{"model": "tiny", "layout": "torch_rows",
        "batch_size": 1, "iters": 1}' --out /tmp/torch_case.json
"""

from __future__ import annotations

import os

# Read once when OpenMP starts (at ``import torch``): set before it (module docstring).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from benchmarks import flops, harness, train_speed  # noqa: E402
from benchmarks import torch_reference as ref  # noqa: E402
from trip_jax import builders, input_pipeline  # noqa: E402
from trip_jax.data import layouts  # noqa: E402
from trip_jax.data.batching import BatchPlan  # noqa: E402
from trip_jax.models import weights  # noqa: E402
from trip_jax.models.tiered import TieredConfig  # noqa: E402

LAYOUTS: tuple[str, ...] = ("torch_padded", "torch_rows")
MODES: tuple[str, ...] = ("eval", "train")
# The reference's encoder input: rows cut at 16 tokens, token types zero.
REFERENCE_ROW_LENGTH = 16
REFERENCE_TOKEN_TYPES = "zeros"


def encoder_config(data: harness.ModelData) -> transformers.PretrainedConfig:
    """The Hugging Face config of the model's encoder (no weights loaded)."""
    model = data.config.model
    if model.encoder:
        return weights.load_config(weights.resolve_model_dir(model.encoder))
    return builders.random_encoder_config(model, data.tokenizer)


def tiered_config(data: harness.ModelData) -> TieredConfig:
    """The tiered architecture of the model's config."""
    return TieredConfig.from_mapping({**data.config.model.tiered.to_dict(),
                                      "max_sentences": data.config.data.max_sentences})


def padded_batch(data: harness.ModelData, indices: list[int]) -> tuple[dict, np.ndarray]:
    """The pairs ``indices`` as the reference fed them: a dense batch at the data's largest
    entity count and 16 tokens a row, re-encoded with rows cut at 16 and zero token types.
    Returns (host batch, token length of every real row)."""
    layout = dataclasses.replace(_dense(data), max_length=REFERENCE_ROW_LENGTH,
                                 token_types=REFERENCE_TOKEN_TYPES)
    pairs = input_pipeline.encode([data.pairs[i] for i in indices], data.tokenizer, layout)
    entities = max(p.num_entities for p in data.encoded)
    local = layout.build(pairs, BatchPlan(np.arange(len(pairs), dtype=np.int32), entities,
                                          {"T": REFERENCE_ROW_LENGTH}), pairs[0].pad_id)
    return local, _real_lengths(pairs)


def rows_batch(data: harness.ModelData, indices: list[int]) -> tuple[dict, np.ndarray]:
    """trip-jax's dense batch of the pairs ``indices`` (the config's buckets; ``row_inputs``
    keeps its rows on real cells). Returns (host batch, token length of every real row)."""
    pairs = [data.encoded[i] for i in indices]
    return (next(input_pipeline.batch_stream(pairs, _dense(data), len(pairs))),
            _real_lengths(pairs))


def _dense(data: harness.ModelData):
    """The dense layout with the config's other data keys, T bucketed per batch."""
    config = data.config.data.copy_and_resolve_references()
    config.layout, config.seq_len = "dense", 0
    return layouts.from_config(config)


def _real_lengths(pairs) -> np.ndarray:
    return np.concatenate([s.lengths for p in pairs for s in p.stories])


def time_torch_step(step: Callable[[], object], iters: int, warmup: int) -> dict:
    """The first (warm-up) run's time and the median of ``iters`` later runs of ``step()``."""
    start = time.perf_counter()
    step()
    first_run_s = time.perf_counter() - start
    for _ in range(warmup - 1):
        step()
    times = []
    usage = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(iters):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_SELF)
    runs = max(iters, 1)
    return {"first_run_s": first_run_s, "warmup_steps": warmup,
            "step_s": statistics.median(times) if times else first_run_s, "step_s_all": times,
            "cpu_user_s_per_step": (after.ru_utime - usage.ru_utime) / runs,
            "cpu_sys_s_per_step": (after.ru_stime - usage.ru_stime) / runs}


def run_case(case: dict) -> dict:
    """Runs one case (keys: model, layout, batch_size, iters, warmup, modes, data_dir,
    max_pairs); returns its record."""
    layout, batch_size = case["layout"], int(case["batch_size"])
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    start = time.perf_counter()
    data = harness.ModelData.load(case["model"], data_dir=case.get("data_dir", ""),
                                  max_pairs=case.get("max_pairs", 0))
    hf_config, tiered = encoder_config(data), tiered_config(data)
    model = ref.ReferenceModel(hf_config, ref.ReferenceConfig.from_tiered(tiered))
    setup_s = time.perf_counter() - start

    indices = harness.representative_indices(data.encoded, batch_size)
    start = time.perf_counter()
    if layout == "torch_padded":
        local, real_lengths = padded_batch(data, indices)
        inputs = ref.padded_inputs(local, pad_id=data.encoded[0].pad_id,
                                   seq_len=REFERENCE_ROW_LENGTH)
        forward = lambda: model.forward_padded(**inputs)  # noqa: E731
        info = train_speed.batch_info(local, real_lengths)
    else:
        local, real_lengths = rows_batch(data, indices)
        inputs = ref.row_inputs(local)
        forward = lambda: model.forward_rows(**inputs)  # noqa: E731
        info = _rows_info(train_speed.batch_info(local, real_lengths), tiered)
    labels = ref.label_tensors(local)
    host_batch_s = time.perf_counter() - start
    step_flops = flops.step_flops(hf_config, tiered, local, real_lengths)

    train = data.config.train
    loss = data.config.loss
    optimizer = ref.ReferenceAdamW(model.parameters(), lr=train.learning_rate,
                                   betas=(train.adam_b1, train.adam_b2), eps=train.adam_eps,
                                   weight_decay=train.weight_decay)
    loss_weights = (loss.pre_weight, loss.eff_weight, loss.conflict_weight, loss.story_weight)

    def eval_step():
        model.eval()
        with torch.no_grad():
            return forward()

    def train_step():
        model.train()
        return ref.train_step(model, optimizer, forward, labels, loss_weights,
                              clip_norm=train.grad_clip_norm)

    record = {"case": case, "model": data.name, "layout": layout, "batch_size": batch_size,
              "framework": "torch", "pairs_per_step": "batched",
              "torch": torch.__version__, "transformers": transformers.__version__,
              "threads": torch.get_num_threads(),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "dtype": "float32",
              "remat": False,
              "tokenizer": builders.tokenizer_spec(data.config.model),
              "encoder": {k: getattr(hf_config, k) for k in (
                  "model_type", "hidden_size", "num_hidden_layers", "intermediate_size")},
              "encoder_matmul_params": flops.encoder_matmul_params(hf_config),
              "batch": info, "setup_s": setup_s, "host_batch_s": host_batch_s,
              "memory": {"rss_after_setup_mib": train_speed.peak_rss_mib()}}
    iters, warmup = int(case.get("iters", 2)), int(case.get("warmup", 1))
    for mode in case.get("modes", MODES):
        steps = {"eval": eval_step, "train": train_step}
        if mode not in steps:
            raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
        timing = time_torch_step(steps[mode], iters, warmup)
        record[mode] = train_speed.rates(timing, info, step_flops[mode])
        record["memory"][f"rss_peak_after_{mode}_mib"] = train_speed.peak_rss_mib()
    return record


def _rows_info(info: dict, tiered: TieredConfig) -> dict:
    """``batch_info`` of the packed batch, counted as the torch step runs it: the real rows at
    T plus one padding row of ``padding_row_length`` tokens (not the packed batch's padding
    rows)."""
    real, seq_len, pad_len = info["real_rows"], info["seq_len"], tiered.padding_row_length
    info = dict(info, encoder_rows=real + 1, row_groups=[[real, real, seq_len], [1, 0, pad_len]],
                encoder_tokens=real * seq_len + pad_len)
    info["packing_efficiency"] = info["real_tokens"] / info["encoder_tokens"]
    return info


def main(argv=None) -> None:
    """Runs the case given as JSON and writes its record to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help="JSON object (see run_case)")
    parser.add_argument("--out", required=True, help="JSON file for the record")
    args = parser.parse_args(argv)
    record = run_case(json.loads(args.case))
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: record[k] for k in ("model", "layout", "batch_size")}
                     | {m: {"step_s": record[m]["step_s"]} for m in MODES if m in record}),
          file=sys.stderr)


if __name__ == "__main__":
    main()
