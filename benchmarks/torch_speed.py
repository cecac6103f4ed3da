"""Times the eager PyTorch reference step on the pairs that the trip-jax cases time.

``python -m benchmarks.torch_speed --case JSON --out FILE``: one case a process, layouts
``torch_padded`` (as the reference ran) and ``torch_rows``; ``build`` / ``measure`` serve
``gpu_check``. Details: benchmarks/README.md#the-pytorch-reference-in-the-same-run.
"""

from __future__ import annotations

import os

# Read once when OpenMP starts (at ``import torch``): set before it (module docstring).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dataclasses  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from benchmarks import cases, flops, harness  # noqa: E402
from trip_jax.data import input_pipeline  # noqa: E402
from trip_jax.data.batching import BatchPlan  # noqa: E402
from trip_jax.interop import torch_reference as ref  # noqa: E402
from trip_jax.models.tiered import TieredConfig  # noqa: E402

# The reference's encoder input: rows cut at 16 tokens, token types zero.
REFERENCE_ROW_LENGTH = 16
REFERENCE_TOKEN_TYPES = "zeros"


def padded_batch(data: harness.ModelData, indices: list[int]) -> tuple[dict, np.ndarray]:
    """The pairs ``indices`` as the reference fed them: a dense batch at the data's largest
    entity count and 16 tokens a row, re-encoded with rows cut at 16 and zero token types.
    Returns (host batch, token length of every real row)."""
    layout = dataclasses.replace(data.layout_named("dense"), max_length=REFERENCE_ROW_LENGTH,
                                 token_types=REFERENCE_TOKEN_TYPES)
    pairs = input_pipeline.encode([data.pairs[i] for i in indices], data.tokenizer, layout)
    entities = max(p.num_entities for p in data.encoded)
    local = layout.build(pairs, BatchPlan(np.arange(len(pairs), dtype=np.int32), entities,
                                          {"T": REFERENCE_ROW_LENGTH}), pairs[0].pad_id)
    return local, harness.real_lengths(pairs)


def rows_batch(data: harness.ModelData, indices: list[int]) -> tuple[dict, np.ndarray]:
    """trip-jax's dense batch of the pairs ``indices`` (the config's buckets; ``row_inputs``
    keeps its rows on real cells). Returns (host batch, token length of every real row)."""
    pairs = [data.encoded[i] for i in indices]
    batch = next(input_pipeline.batch_stream(pairs, data.layout_named("dense"), len(pairs)))
    return batch, harness.real_lengths(pairs)


# The compute dtypes a case may ask for: float32 (on a GPU with TF32 matmuls allowed, as the
# authors' PyTorch ran), or bfloat16 autocast around the forward pass.
DTYPES = ("float32", "bfloat16")


def default_device() -> str:
    """"cuda" where torch sees a GPU, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def build(case: dict, device: str = "cpu") -> tuple[harness.ModelData, ref.ReferenceModel,
                                                     float]:
    """The pairs and the reference model of ``case["model"]`` on ``device`` (random init,
    seed 0), and the setup seconds: one init, which every case of the same model may share
    (``measure``)."""
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    start = time.perf_counter()
    data = harness.ModelData.load(case["model"], data_dir=case.get("data_dir", ""),
                                  max_pairs=case.get("max_pairs", 0))
    model = ref.ReferenceModel(data.encoder_config(), ref.ReferenceConfig.from_tiered(
        data.tiered, data.config.data.max_sentences)).to(device)
    return data, model, time.perf_counter() - start


def _autocast(forward, device: str, dtype: str):
    """``forward`` under bfloat16 autocast with float32 outputs (the losses run in float32,
    as autocast runs them), or ``forward`` itself for float32."""
    if dtype == "float32":
        return forward

    def cast(x):
        return [z.float() for z in x] if isinstance(x, list) else x.float()

    def autocast_forward():
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            outputs = forward()
        return {k: cast(v) for k, v in outputs.items()}

    return autocast_forward


def _synchronized(step, device: str):
    """``step`` that returns only once the device has finished its work."""
    if device != "cuda":
        return step
    return lambda: (step(), torch.cuda.synchronize())


def measure(data: harness.ModelData, model: ref.ReferenceModel, case: dict, setup_s: float,
            device: str = "cpu") -> dict:
    """Times ``case`` (``run_case`` has the keys) on ``model`` (built by ``build`` for the same
    model) on ``device``; returns its record. On a GPU, float32 allows TF32 matmuls and the
    device peak is this case's (the peak statistics are reset first)."""
    layout, batch_size = case["layout"], int(case["batch_size"])
    dtype = case.get("dtype") or "float32"
    if layout not in cases.TORCH_LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {cases.TORCH_LAYOUTS}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.cuda.reset_peak_memory_stats()
    hf_config, tiered = data.encoder_config(), data.tiered
    indices = harness.representative_indices(data.encoded, batch_size)
    start = time.perf_counter()
    if layout == "torch_padded":
        local, real_lengths = padded_batch(data, indices)
        inputs = ref.padded_inputs(local, pad_id=data.encoded[0].pad_id,
                                   seq_len=REFERENCE_ROW_LENGTH)
        inputs = {k: v.to(device) for k, v in inputs.items()}
        forward = lambda: model.forward_padded(**inputs)  # noqa: E731
        info = harness.batch_info(local, real_lengths)
    else:
        local, real_lengths = rows_batch(data, indices)
        inputs = {k: v.to(device) if torch.is_tensor(v) else v
                  for k, v in ref.row_inputs(local).items()}
        forward = lambda: model.forward_rows(**inputs)  # noqa: E731
        info = _rows_info(harness.batch_info(local, real_lengths), tiered)
    forward = _autocast(forward, device, dtype)
    labels = {k: v.to(device) for k, v in ref.label_tensors(local).items()}
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
              "device": device, "tf32": device == "cuda" and dtype == "float32",
              "autocast": dtype != "float32",
              "threads": torch.get_num_threads(),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "dtype": dtype,
              "remat": False,
              "tokenizer": data.tokenizer_name(),
              "encoder": {k: getattr(hf_config, k) for k in (
                  "model_type", "hidden_size", "num_hidden_layers", "intermediate_size")},
              "encoder_matmul_params": flops.encoder_matmul_params(hf_config),
              "batch": info, "setup_s": setup_s, "host_batch_s": host_batch_s,
              "memory": {"rss_after_setup_mib": harness.peak_rss_mib()}}
    iters, warmup = int(case.get("iters", 2)), int(case.get("warmup", 1))
    for mode in case.get("modes", harness.MODES):
        steps = {"eval": eval_step, "train": train_step}
        if mode not in steps:
            raise ValueError(f"unknown mode {mode!r}; expected one of {harness.MODES}")
        timing = harness.time_calls(_synchronized(steps[mode], device), iters, warmup)
        timing = {"first_run_s": timing["first_run_s"], "warmup_steps": warmup, **timing}
        record[mode] = harness.rates(timing, info, step_flops[mode])
        record["memory"][f"rss_peak_after_{mode}_mib"] = harness.peak_rss_mib()
        if device == "cuda":
            record["memory"][f"device_peak_after_{mode}_bytes"] = (
                torch.cuda.max_memory_allocated())
    return record


def run_case(case: dict) -> dict:
    """Runs one case (keys: model, layout, batch_size, iters, warmup, modes, data_dir,
    max_pairs, dtype: "float32" (default) or "bfloat16" autocast; device: default
    ``default_device()``); returns its record."""
    device = case.get("device") or default_device()
    data, model, setup_s = build(case, device)
    return measure(data, model, case, setup_s, device)


def _rows_info(info: dict, tiered: TieredConfig) -> dict:
    """``batch_info`` of the dense batch, counted as the torch step runs it: the real rows at
    T plus one padding row of ``padding_row_length`` tokens (not the dense batch's padding
    cells)."""
    real, seq_len, pad_len = info["real_rows"], info["seq_len"], tiered.padding_row_length
    info = dict(info, encoder_rows=real + 1, row_groups=[[real, real, seq_len], [1, 0, pad_len]],
                encoder_tokens=real * seq_len + pad_len)
    info["packing_efficiency"] = info["real_tokens"] / info["encoder_tokens"]
    return info


def main(argv=None) -> None:
    """Runs the case given as JSON (``--case``) and writes its record to ``--out``."""
    harness.case_main(run_case, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
