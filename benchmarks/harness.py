"""The benchmarks' one harness: a model's real training objects, its batches, and the timers.

``ModelData.load`` and ``Harness.build`` build what training builds (``build_trainer``), so the
benchmarks time exactly those steps; batches, timers, memory measures and ``case_main``, the
per-case worker's command line. Details: benchmarks/README.md#the-code-file-by-file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from benchmarks import cases, flops
from trip_jax.config.sections import Config
from trip_jax.config.typed import replace, typed
from trip_jax.data import input_pipeline, protocol
from trip_jax.models import builders
from trip_jax.runtime import sharding
from trip_jax.data import features, layouts, readers, tokenizers
from trip_jax.data.batching import BatchPlan
from trip_jax.data.features import EncodedPair
from trip_jax.data.layouts import Layout
from trip_jax.data.types import StoryPair
from trip_jax.models import weights
from trip_jax.models.tiered import TieredConfig

if TYPE_CHECKING:  # imported where a Harness is built: ModelData alone does not need it
    from trip_jax.training import step as training_step

# The pair sets a harness can load.
SPLITS = ("dev", "dev_train")
MODES: tuple[str, ...] = ("eval", "train")
# Steps the optimizer schedule is built for (the constant schedule ignores it).
_SCHEDULE_STEPS = 10_000


@dataclasses.dataclass
class ModelData:
    """One model's run configuration and the pairs, raw and tokenized with its tokenizer.

    ``num_entities``: E of every batch where training fixes it (``Layout.for_splits``:
    data_max entity padding or packed_tokens), the largest entity count of the protocol's three
    splits and of ``pairs`` (which ignore ``config.data.max_pairs``); else None.
    """

    name: str
    config: Config  # typed (trip_jax.config.typed)
    tokenizer: Any
    pairs: list[StoryPair]
    encoded: list[EncodedPair]
    num_entities: int | None = None

    @classmethod
    def load(cls, name: str, *, data_dir: str = "", max_pairs: int = 0,
             dtype: str | None = None, remat: bool | None = None,
             overrides: Mapping[str, Any] | None = None, split: str = "dev") -> "ModelData":
        """Model ``name`` (``cases.model_config``) with ``overrides`` (dotted config keys) set,
        and the pairs of ``split`` ("dev", or "dev_train": what a dev_train run trains on) of
        ``data_dir`` (default: ``$TRIP_DATA_DIR``); ``max_pairs`` keeps the first N pairs."""
        changes = {**(overrides or {}), "data.data_dir": data_dir}
        if split == "dev_train":
            # The pairs a dev_train run trains on: dev minus its held-out slice.
            changes["data.protocol"] = "dev_train"
        elif split != "dev":
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        config = replace(typed(cases.model_config(name, dtype=dtype, remat=remat)), changes)
        splits = protocol.load_protocol_splits(config.data)
        if split == "dev_train":
            pairs = splits.train
        else:
            pairs = readers.load_split(readers.default_data_dir(data_dir or None), "dev")
        if max_pairs:
            pairs = pairs[:max_pairs]
        tokenizer = tokenizers.build_tokenizer(config.model, features.vocabulary_texts(pairs))
        layout = layouts.from_config(config.data)
        encoded = input_pipeline.encode(pairs, tokenizer, layout)
        fixed = layout.for_splits(splits).num_entities
        if fixed is not None:  # the harness's pairs may go beyond config.data.max_pairs
            fixed = max([fixed, *(p.num_entities for p in encoded)])
        return cls(name, config, tokenizer, list(pairs), encoded, fixed)

    @property
    def layout(self) -> Layout:
        """The config's batch layout (``trip_jax.data.layouts``), E fixed as training fixes it
        (``num_entities``)."""
        return dataclasses.replace(layouts.from_config(self.config.data),
                                   num_entities=self.num_entities)

    def layout_named(self, name: str) -> Layout:
        """The layout ``name`` (``trip_jax.data.layouts``) with the config's other data keys,
        E and T chosen per batch (no fixed entity count or ``data.seq_len``)."""
        return layouts.from_config(
            replace(self.config, {"data.layout": name, "data.seq_len": 0}).data)

    @property
    def tiered(self) -> TieredConfig:
        """The tiered architecture of the model's config."""
        return self.config.model.tiered

    def encoder_config(self):
        """The Hugging Face config of the model's encoder (no weights loaded)."""
        model = self.config.model
        if model.encoder:
            return weights.load_config(weights.resolve_model_dir(model.encoder))
        return builders.random_encoder_config(model, self.tokenizer)

    def tokenizer_name(self) -> str:
        """What tokenized the rows (for the results)."""
        return tokenizers.tokenizer_spec(self.config.model)


@dataclasses.dataclass
class Harness:
    """One model's data (``ModelData``), encoder config, trainer (mesh, jitted steps) and
    fresh train state."""

    data: ModelData
    hf_config: Any
    trainer: training_step.Trainer
    state: Any

    name = property(lambda self: self.data.name)
    config = property(lambda self: self.data.config)
    encoded = property(lambda self: self.data.encoded)
    num_entities = property(lambda self: self.data.num_entities)
    layout = property(lambda self: self.data.layout)
    layout_named = property(lambda self: self.data.layout_named)
    tiered = property(lambda self: self.data.tiered)
    mesh = property(lambda self: self.trainer.mesh)
    train_step = property(lambda self: self.trainer.train_step)  # training.step.make_train_step
    eval_step = property(lambda self: self.trainer.eval_step)  # training.step.make_eval_step

    @classmethod
    def build(cls, name: str, *, abstract: bool = False, **load) -> "Harness":
        """Builds model ``name`` on its pairs (keyword arguments: ``ModelData.load``); with
        ``abstract`` the train state is only its shapes (``Trainer.abstract_state``: nothing
        allocated or compiled, enough to trace the steps)."""
        data = ModelData.load(name, **load)
        from trip_jax.training import step as training_step  # noqa: PLC0415 - not for ModelData

        config = data.config
        hf_config, encoder_params = builders.build_encoder_config(config.model, data.tokenizer)
        model = builders.build_model(config, hf_config)
        trainer = training_step.build_trainer(config, model, sharding.create_mesh(config.mesh),
                                              _SCHEDULE_STEPS)
        state = trainer.abstract_state if abstract else trainer.fresh_state(encoder_params)
        return cls(data, hf_config, trainer, state)

    def config_batch(self, pairs: Sequence[EncodedPair]) -> dict[str, np.ndarray]:
        """``pairs`` as one batch of the config's layout and buckets (as training batches)."""
        return next(input_pipeline.batch_stream(pairs, self.layout, len(pairs)))

    def reference_dense_batch(self, pair: EncodedPair) -> dict[str, np.ndarray]:
        """One pair in the reference's layout (see ``reference_dense_shape``)."""
        entities, seq_len = reference_dense_shape(self.encoded)
        return self.layout_named("dense").build(
            [pair], BatchPlan(np.zeros(1, np.int32), entities, {"T": seq_len}), pair.pad_id)

    def layout_batch(self, layout: str, pairs: Sequence[EncodedPair]) -> dict[str, np.ndarray]:
        """``pairs`` as one batch of benchmark layout ``layout`` (``cases.LAYOUTS``; the
        harness was built with its overrides)."""
        kind = cases.LAYOUTS[layout].batch
        if kind == "config":
            return self.config_batch(pairs)
        if kind == "reference_dense":
            return self.reference_dense_batch(pairs[0])
        raise ValueError(f"layout {layout!r}: unknown batch kind {kind!r}")

    def largest_batch(self, batch_size: int) -> tuple[dict[str, np.ndarray], list[EncodedPair]]:
        """The batch of one unshuffled epoch over the pairs at ``batch_size`` (the config's
        layout, E fixed as training fixes it) with the most encoder tokens (ties: the most real
        tokens), and its pairs: the largest batch shape training on these pairs compiles."""
        def size(batch):
            return batch["input_ids"].size, int(batch["attention_mask"].sum())

        best = max(input_pipeline.batch_stream(self.encoded, self.layout, batch_size), key=size)
        return best, [self.encoded[i] for i in best["pair_index"][best["pair_mask"]]]

    def layout_summary(self, batch_size: int) -> dict:
        """Padding and compiled shapes of one epoch over the pairs at ``batch_size``: real rows
        and real tokens over the encoder rows/tokens of every layout (``layout_named``: the
        config's pack length, shape limit, row sharing and buckets, E bucketed per batch) and of
        the reference layout, and each one's distinct batch shapes (one compilation each)."""
        S = self.config.data.max_sentences
        summary = {"batch_size": batch_size, "pairs": len(self.encoded)}
        for name in layouts.NAMES:
            stats = self.layout_named(name).stats(self.encoded, batch_size)
            summary.update(real_rows=stats["real_rows"], real_tokens=stats["real_tokens"])
            summary[name] = {"rows": stats["rows"], "real_row_fraction": stats["real_fraction"],
                             "tokens": stats["tokens"],
                             "real_token_fraction": stats["token_fraction"],
                             "distinct_shapes": len(stats["shapes"])}
        real_tokens = summary["real_tokens"]
        entities, seq_len = reference_dense_shape(self.encoded)
        rows = len(self.encoded) * 2 * entities * S
        summary["reference_dense"] = {
            "rows": rows, "real_row_fraction": summary["real_rows"] / rows,
            "tokens": rows * seq_len, "real_token_fraction": real_tokens / (rows * seq_len),
            "distinct_shapes": 1, "entities": entities, "seq_len": seq_len}
        return summary

    def to_device(self, local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """The host→device copy the training loop makes (``input_pipeline.global_batch``)."""
        return input_pipeline.global_batch(local, self.mesh)


def reference_dense_shape(encoded: Sequence[EncodedPair]) -> tuple[int, int]:
    """(E, T) of the reference layout: the data's most entities and longest row."""
    return (max(p.num_entities for p in encoded), features.max_row_length(encoded))


def representative_indices(encoded: Sequence[EncodedPair], count: int) -> list[int]:
    """Indices of ``count`` pairs at evenly spaced quantiles of the pairs' row counts (the
    median pair for count 1), so that a fixed batch holds about the data's mean rows per pair."""
    if not 1 <= count <= len(encoded):
        raise ValueError(f"cannot pick {count} of {len(encoded)} pairs")
    order = np.argsort([p.num_rows for p in encoded], kind="stable")
    return [int(order[int((i + 0.5) * len(encoded) / count)]) for i in range(count)]


def representative_pairs(encoded: Sequence[EncodedPair], count: int) -> list[EncodedPair]:
    """The pairs of ``representative_indices``."""
    return [encoded[i] for i in representative_indices(encoded, count)]


def real_lengths(pairs: Sequence[EncodedPair]) -> np.ndarray:
    """The token length of every real row of ``pairs``."""
    return np.concatenate([s.lengths for p in pairs for s in p.stories])


# --- measuring --------------------------------------------------------------------------


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_peak_bytes() -> int | None:
    """Peak bytes in use on the first local device, where the backend reports it (GPU/TPU)."""
    stats = jax.local_devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def jaxpr_equations(fn: Callable, *args) -> int:
    """The equations of ``jax.make_jaxpr(fn)(*args)`` (traced, not compiled), counted into every
    nested jaxpr (jit, custom derivatives, remat, a scan's or loop's body once, each branch)."""
    def count(jaxpr) -> int:
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # a ClosedJaxpr's inner Jaxpr
        total = len(jaxpr.eqns)
        for eqn in jaxpr.eqns:
            for value in eqn.params.values():
                for sub in value if isinstance(value, (list, tuple)) else (value,):
                    if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                        total += count(sub)
        return total

    return count(jax.make_jaxpr(fn)(*args))


def xla_cost(compiled) -> dict:
    """XLA's FLOP count and memory plan of a compiled step."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0] if cost else {}
    result = {"xla_flops": float(cost.get("flops", 0.0)) if cost else None}
    memory = compiled.memory_analysis()
    if memory is not None:
        result["temp_bytes"] = int(memory.temp_size_in_bytes)
        result["argument_bytes"] = int(memory.argument_size_in_bytes)
        result["output_bytes"] = int(memory.output_size_in_bytes)
        result["alias_bytes"] = int(memory.alias_size_in_bytes)  # outputs in donated inputs
    return result


def time_calls(step: Callable[[], object], iters: int, warmup: int = 1) -> dict:
    """Runs ``step()`` (it returns when its work is done) ``warmup`` times, the first timed
    (``first_run_s``), then ``iters`` timed times: ``step_s`` = their median (the first run's
    time when ``iters`` is 0), ``step_s_all``, and the CPU seconds per timed run, user (compute
    threads) and system (kernel time: page faults of new buffers, thread synchronisation)."""
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
    return {"first_run_s": first_run_s,
            "step_s": statistics.median(times) if times else first_run_s, "step_s_all": times,
            "cpu_user_s_per_step": (after.ru_utime - usage.ru_utime) / runs,
            "cpu_sys_s_per_step": (after.ru_stime - usage.ru_stime) / runs}


def time_compiled(lowerable, call: Callable[[], object], iters: int, args: tuple) -> dict:
    """A jitted step: compile time (ahead of time, on ``args``), then ``time_calls`` of
    ``call()`` (one step; returns what to block on; the compilation filled the jit cache, so it
    does not compile again), ``first_call_s`` = compile + first run, and ``xla_cost``."""
    start = time.perf_counter()
    compiled = lowerable.lower(*args).compile()
    compile_s = time.perf_counter() - start
    timing = time_calls(lambda: jax.block_until_ready(call()), iters)
    return {"compile_s": compile_s, "first_run_s": timing["first_run_s"],
            "first_call_s": compile_s + timing["first_run_s"], **timing, **xla_cost(compiled)}


def state_sizes(state) -> dict:
    """Parameter count and bytes of the train state's parameters and optimizer state, and
    the parameters of each top-level module (the encoder, the heads, the detector)."""
    def count(tree):
        return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))

    def nbytes(tree):
        return sum(int(x.nbytes) for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "nbytes"))

    return {"params": count(state.params), "param_bytes": nbytes(state.params),
            "opt_state_bytes": nbytes(state.opt_state),
            "params_by_module": {k: count(v) for k, v in state.params.items()}}


def batch_info(local: dict[str, np.ndarray], lengths: np.ndarray) -> dict:
    """Pairs, real and encoder rows and tokens, and shapes of a host batch (``lengths``: of
    every real row). ``real_tokens`` counts every real row's tokens (a row-by-row encoder's
    work); ``encoded_real_tokens`` those the encoder runs on (fewer where packed_tokens encodes
    rows of equal tokens once); ``packing_efficiency`` = the latter / ``encoder_tokens``."""
    groups = flops.row_group_shapes(local)
    packed = "segment_ids" in local  # rows share sequences
    info = {"pairs": int(local["pair_mask"].sum()), "real_rows": int(local["row_mask"].sum()),
            "encoder_rows": (int(local["row_start"].size) if packed
                             else sum(rows for rows, _, _ in groups)),
            "seq_len": int(local["input_ids"].shape[1]),
            "row_groups": [list(g) for g in groups],  # (rows, real rows, T) per group
            "grid_shape": list(local["row_mask"].shape),
            "grid_slots": int(np.prod(local["row_mask"].shape)),
            "real_tokens": int(lengths.sum()),
            "encoded_real_tokens": (int((local["segment_ids"] > 0).sum()) if packed
                                    else int(lengths.sum())),
            "encoder_tokens": sum(rows * seq_len for rows, _, seq_len in groups)}
    if packed:
        info["sequences"] = int(local["input_ids"].shape[0])
    info["packing_efficiency"] = info["encoded_real_tokens"] / info["encoder_tokens"]
    return info


def rates(timing: dict, info: dict, step_flops: dict) -> dict:
    """One timed mode: the timing (``step_s``), its FLOPs, and its throughputs per second
    (pairs, real rows, real tokens, encoder rows, model FLOPs, XLA FLOPs) from ``info``."""
    step = timing["step_s"]
    result = {"pairs_per_s": info["pairs"] / step, "real_rows_per_s": info["real_rows"] / step,
              "tokens_per_s": info["real_tokens"] / step,
              "encoder_rows_per_s": info["encoder_rows"] / step,
              "model_flops_per_s": step_flops["model_flops"] / step}
    if timing.get("xla_flops"):
        result["xla_flops_per_s"] = timing["xla_flops"] / step
    return {**timing, **step_flops, **result}


def case_main(run_case: Callable[[dict], dict], description: str, argv=None) -> None:
    """A per-case worker's command line: runs ``run_case`` on the ``--case`` JSON object and
    writes its record to ``--out``; prints the step times to stderr."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--case", required=True, help="JSON object (see run_case)")
    parser.add_argument("--out", required=True, help="JSON file for the record")
    args = parser.parse_args(argv)
    record = run_case(json.loads(args.case))
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: record[k] for k in ("model", "layout", "batch_size")}
                     | {m: {k: record[m][k] for k in ("step_s", "compile_s") if k in record[m]}
                        for m in MODES if m in record}), file=sys.stderr)
