"""The train and eval steps of each encoder family exported with ``jax.export`` for GPU and TPU.

``python -m benchmarks.export_steps --out benchmarks/results/export_steps.json`` exports the steps
of configs/roberta.py, configs/t5.py and configs/modernbert.py at their encoders' published sizes
(shapes only, no weights) for cuda and tpu from this machine; ``--report FILE`` prints the table.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

import jax
from jax import export

from benchmarks.paper_encoders import PAPER_ENCODERS
from trip_jax.compile.encoders import PUBLISHED
from trip_jax.config.typed import typed
from trip_jax.models import builders
from trip_jax.runtime import sharding
from trip_jax.training.step import Trainer, build_trainer

PLATFORMS = ("cuda", "tpu")
# config file -> its encoder's published hyperparameters (the hub's config.json keys that differ
# from the transformers config class's defaults).
ENCODERS: dict[str, dict] = {
    "roberta": PAPER_ENCODERS["roberta"],  # roberta-large
    "t5": PUBLISHED["google/flan-t5-large"],
    "modernbert": PUBLISHED["answerdotai/ModernBERT-large"],
}
# Tokens per row of the exported batch: data.max_length at exact fidelity, the configs' own.
SEQ_LEN = 16


def export_steps(trainer: Trainer, *, seq_len: int = SEQ_LEN,
                 platforms: tuple[str, ...] = PLATFORMS) -> dict:
    """``{"train": ..., "eval": ...}``: each step exported for ``platforms`` on the train state's
    shapes and a one-pair batch (``builders.example_batch``), as ``{"exported": jax.export
    .Exported, "seconds": export time, "stablehlo_bytes": the module's text, "bytecode_bytes": its
    portable bytecode (``mlir_module_serialized``)}``."""
    state = trainer.abstract_state
    batch = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                         builders.example_batch(trainer.config.data.max_sentences,
                                                seq_len=seq_len))
    out = {}
    for name, step, args in (("train", trainer.train_step, (state, batch)),
                             ("eval", trainer.eval_step, (state.params, batch))):
        start = time.perf_counter()
        exported = export.export(step, platforms=platforms)(*args)
        seconds = time.perf_counter() - start
        out[name] = {"exported": exported, "seconds": seconds,
                     "stablehlo_bytes": len(exported.mlir_module().encode()),
                     "bytecode_bytes": len(exported.mlir_module_serialized)}
    return out


def paper_trainer(name: str) -> Trainer:
    """The trainer of ``configs/<name>.py`` around a random encoder of ``ENCODERS[name]``'s
    shapes (nothing downloaded, nothing allocated until a step runs)."""
    config = typed(importlib.import_module(f"configs.{name}").get_config())
    hf_config = builders.encoder_config_from_dict(ENCODERS[name])
    model = builders.build_model(config, hf_config)
    return build_trainer(config, model, sharding.create_mesh(config.mesh), total_steps=1)


def measure(names) -> dict:
    """One record per config: its family, encoder parameters and each step's export."""
    records = []
    for name in names:
        trainer = paper_trainer(name)
        params = trainer.abstract_state.params["encoder"]
        steps = export_steps(trainer)
        records.append({
            "config": f"configs/{name}.py", "model_type": ENCODERS[name]["model_type"],
            "encoder_parameters": sum(x.size for x in jax.tree.leaves(params)),
            **{f"{step}_{key}": value[key] for step, value in steps.items()
               for key in ("seconds", "stablehlo_bytes", "bytecode_bytes")}})
    return {"platforms": list(PLATFORMS), "seq_len": SEQ_LEN, "jax": jax.__version__,
            "host": platform.machine(), "cpu_devices": jax.device_count(), "records": records,
            "markdown": table(records)}


def table(records) -> str:
    """The markdown table of ``measure``'s records."""
    lines = ["| config | model type | encoder parameters | train export s | train StableHLO "
             "| eval export s | eval StableHLO |", "|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| `{r['config']}` | {r['model_type']} | "
                     f"{r['encoder_parameters'] / 1e6:.0f} M | {r['train_seconds']:.1f} | "
                     f"{r['train_stablehlo_bytes'] / 1e6:.2f} MB | {r['eval_seconds']:.1f} | "
                     f"{r['eval_stablehlo_bytes'] / 1e6:.2f} MB |")
    return "\n".join(lines)


def main(argv=None) -> dict | None:
    """The command (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(ENCODERS))
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--report", help="print the table of this JSON file and stop")
    args = parser.parse_args(argv)
    if args.report:
        print(json.loads(Path(args.report).read_text())["markdown"])
        return None
    result = measure([n for n in args.configs.split(",") if n])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(result["markdown"])
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
