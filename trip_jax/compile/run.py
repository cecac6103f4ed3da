"""``--mode=compile``: the config's train and eval steps compiled by XLA:TPU or XLA:GPU.

``compile_steps`` lowers the steps ``build_trainer`` builds on the compile-only devices of
libtpu's or the CUDA plugin's topology, from abstract shapes, and compiles them; ``run`` prints
one line a step, writes ``WORKDIR/compile/<type>.json``, refuses a step that does not fit."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import jax

from trip_jax.compile import chips as chips_lib
from trip_jax.compile import count, encoders, figures, gpus, shapes, targets
from trip_jax.evaluation.evaluate import eval_batch_size
from trip_jax.models import builders
from trip_jax.runtime import jax_setup, platforms, sharding
from trip_jax.training.step import build_trainer

GIB = 2 ** 30
# libtpu without a TPU: no lock file (several compiles at once), no metadata-server lookups and
# none of the errors it logs when it cannot find this machine's TPU.
LIBTPU_ENV = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1",
              "TPU_WORKER_HOSTNAMES": "localhost"}
# The CUDA plugin without a GPU: no driver to check its CUDA libraries' versions against.
CUDA_ENV = {"JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1"}
CUDA_PLUGIN = "jax_cuda12_plugin"
COMPILERS = {"tpu": "XLA:TPU", "cuda": "XLA:GPU"}
# XLA:TPU refuses a program larger than the chip's memory at compile time with this.
_OUT_OF_MEMORY = re.compile(r"(RESOURCE_EXHAUSTED|[Rr]an out of memory)")
# XLA:GPU without a GPU: its Triton GEMM emitter found no tiling of a dot; cuBLAS then.
_NO_TRITON_TILE = re.compile(r"Couldn't find output tile sizes")
NO_TRITON_GEMM = {"xla_gpu_enable_triton_gemm": False}
_NEEDED = re.compile(r"(?:[Uu]sed|memory required for HLO temporaries \()([0-9.]+)([KMGT]?)")


class CompileError(ValueError):
    """A compile the user asked for that cannot be done or does not fit: one line, exit 2."""

    exit_code = 2


@functools.lru_cache(maxsize=None)
def topology_devices(accelerator: chips_lib.Accelerator) -> tuple:
    """The devices of ``accelerator``'s topology (libtpu's description, one device a chip: the
    chip's ``chip_config``; or the CUDA plugin's of ``gpus.target_config``; no TPU or GPU needed)."""
    if accelerator.platform == "cuda":
        return gpu_devices(accelerator)
    if not platforms.installed("libtpu"):
        raise CompileError("--mode=compile needs libtpu, which is not installed: pip install -e "
                           "'.[tpu]'")
    for key, value in LIBTPU_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator.topology.split(":")[0] + "-1")
    from jax.experimental import topologies
    sides = [int(n) for n in accelerator.topology.split(":")[1].split("x")]
    options = {}
    if len(sides) == 2 and min(sides) < 2:  # a slice smaller than libtpu's 2x2 host
        options["chips_per_host_bounds"] = [min(side, 2) for side in sides] + [1]
    if accelerator.chip.chip_config:  # one device a chip, as JAX's TPU meshes need
        options["chip_config_name"] = accelerator.chip.chip_config
    return tuple(topologies.get_topology_desc(accelerator.topology, "tpu", **options).devices)


def gpu_devices(accelerator: chips_lib.Accelerator) -> tuple:
    """The compile-only devices of a GPU node (the CUDA plugin's topology "HOSTSx1xGPUS" of
    ``gpus.target_config``); CompileError in one line without the plugin."""
    if not platforms.installed(CUDA_PLUGIN):
        raise CompileError(f"--topology={accelerator.name} needs the CUDA plugin, which is not "
                           "installed: pip install -e '.[cuda]'")
    for key, value in CUDA_ENV.items():
        os.environ.setdefault(key, value)
    from jax.experimental import topologies
    text = gpus.target_config(accelerator.chip, gpus.dnn_version())
    return tuple(topologies.get_topology_desc("", "cuda", topology=accelerator.topology,
                                              target_config=text).devices)


def on_devices(accelerator: chips_lib.Accelerator) -> chips_lib.Accelerator:
    """``accelerator`` when libtpu describes it with one JAX device a chip (every chip here: v4
    in megacore, ``topology_devices``); CompileError in one line when it gives another count
    (one device per TensorCore), a layout JAX's TPU meshes refuse. A GPU node as it is."""
    if accelerator.platform != "tpu":
        return accelerator
    devices = len(topology_devices(accelerator))
    if devices != accelerator.chips:
        raise CompileError(
            f"--topology={accelerator.name}: libtpu describes it with {devices} devices (one per "
            f"TensorCore) for {accelerator.chips} chips, and JAX's TPU meshes need one device a "
            "chip")
    return accelerator


def _need_from_error(message: str) -> int | None:
    """Bytes XLA:TPU's out-of-memory message says a chip needs ("Used X of Y hbm", or "the total
    memory required for HLO temporaries (X) exceeds available HBM"); None if it says neither."""
    match = _NEEDED.search(message)
    if not match:
        return None
    scale = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
    return int(float(match.group(1)) * scale[match.group(2)])


def _parameter_layout(trainer) -> dict[str, int]:
    """How the train state's parameters are placed: arrays sharded over fsdp, replicated ones,
    and the bytes of parameters a chip holds."""
    fsdp = trainer.mesh.shape["fsdp"]
    leaves = zip(jax.tree.leaves(trainer.abstract_state.params),
                 jax.tree.leaves(trainer.state_shardings.params))
    sharded = replicated = per_chip = 0
    for leaf, where in leaves:
        split = "fsdp" in [axis for axis in where.spec if axis]
        sharded += split
        replicated += not split
        per_chip += leaf.size * leaf.dtype.itemsize // (fsdp if split else 1)
    return {"sharded_arrays": sharded, "replicated_arrays": replicated,
            "parameter_bytes_per_chip": per_chip}


def _placement(compiled, step: str, params) -> dict[str, dict[str, list]]:
    """{parameter path: {"shape", "spec"}}: where the compiled step takes each parameter."""
    placed = compiled.input_shardings[0][0]
    placed = placed.params if step == "train" else placed
    paths = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(path): {"shape": list(leaf.shape),
                                         "spec": [axis for axis in where.spec]}
            for (path, leaf), where in zip(paths, jax.tree.leaves(placed))}


def argument_bytes(args, shardings) -> int:
    """Bytes a chip holds of ``args`` (abstract arrays) placed by ``shardings`` (a matching tree
    of NamedShardings): a lower bound on what the step needs, known before compiling."""
    return sum(math.prod(where.shard_shape(leaf.shape)) * leaf.dtype.itemsize
               for leaf, where in zip(jax.tree.leaves(args), jax.tree.leaves(shardings)))


def build(config, accelerator: chips_lib.Accelerator):
    """The trainer training would build for ``config`` on ``accelerator``'s devices (a
    one-step optimizer schedule: its shape does not depend on the step count); compile its
    steps for ``on_devices(accelerator)``."""
    devices = topology_devices(accelerator)
    try:
        mesh = sharding.create_mesh(config.mesh, devices)
    except ValueError as err:
        raise CompileError(f"{err} ({accelerator.name}: {len(devices)} chips)") from None
    try:
        hf_config = encoders.encoder_config(config)
    except encoders.UnknownEncoder as err:
        raise CompileError(str(err)) from None
    model = builders.build_model(config, hf_config)
    with jax_setup.prng_impl(config.train.prng_impl):  # the steps' dropout keys, as training's
        return build_trainer(config, model, mesh, total_steps=1)


def _compile(lowered, record: dict[str, Any]):
    """``lowered.compile()``; on XLA:GPU's compile-only route, where the Triton GEMM emitter
    finds no tile for a small f32 dot (no GPU to autotune on: "Couldn't find output tile
    sizes"), once more with ``xla_gpu_enable_triton_gemm`` off (cuBLAS GEMMs), noted in
    ``record["compiler_options"]``."""
    try:
        return lowered.compile()
    except Exception as err:  # XLA's errors have no public type of their own
        if record["platform"] != "cuda" or not _NO_TRITON_TILE.search(str(err)):
            raise
    record["compiler_options"] = dict(NO_TRITON_GEMM)
    return lowered.compile(compiler_options=NO_TRITON_GEMM)


def compile_step(trainer, step: str, pairs: int, accelerator: chips_lib.Accelerator
                 ) -> dict[str, Any]:
    """One step ("train" or "eval") of ``trainer`` lowered and compiled for ``pairs`` pairs:
    its record (sizes, seconds and ``figures.step_figures``; ``fits`` False with the bytes
    XLA:TPU reported when it refused the program as too large for the chip). On a GPU the
    roofline takes the peak of the config's dtype and precision (``gpus.at_precision``) and,
    as XLA:GPU gives no cost analysis, ``count.step_flops`` (``figures.counted_cost``)."""
    shards = sharding.num_batch_shards(trainer.mesh)
    try:
        sharding.check_batch_split(pairs, trainer.mesh.shape)
    except ValueError as err:
        raise CompileError(str(err)) from None
    batch = shapes.batch_spec(trainer.config, pairs, shards)
    batch_placement = jax.tree.map(lambda _: sharding.batch_sharding(trainer.mesh), batch)
    state = trainer.abstract_state
    function, args = ((trainer.train_step, (state, batch)) if step == "train"
                      else (trainer.eval_step, (state.params, batch)))
    record: dict[str, Any] = {
        "step": step, "pairs": pairs, "accelerator": accelerator.name,
        "platform": accelerator.platform, "compiler": COMPILERS[accelerator.platform],
        "topology": accelerator.topology, "chip": accelerator.chip.device_kind,
        "chips": accelerator.chips, "mesh": dict(trainer.mesh.shape),
        "batch_sizes": shapes.batch_sizes(trainer.config, pairs, shards),
        "parameters": _parameter_layout(trainer)}
    placed = ((trainer.state_shardings, batch_placement) if step == "train"
              else (trainer.state_shardings.params, batch_placement))
    need = argument_bytes(args, placed)
    if need > accelerator.chip.hbm_bytes:  # refused without compiling: the inputs alone
        record.update(compile_seconds=0.0, fits=False, hbm_bytes=accelerator.chip.hbm_bytes,
                      refused_before_compiling=True,
                      memory_bytes={"arguments": need, "total": need, "at_least": True})
        return record
    start = time.perf_counter()
    lowered = function.lower(*args)
    record["lower_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    try:
        compiled = _compile(lowered, record)
    except Exception as err:  # XLA's errors have no public type of their own
        if not _OUT_OF_MEMORY.search(str(err)):
            raise
        needed = _need_from_error(str(err))
        temporaries = "temporaries" in str(err)
        record.update(compile_seconds=time.perf_counter() - start, fits=False,
                      hbm_bytes=accelerator.chip.hbm_bytes,
                      memory_bytes={"arguments": need,
                                    "total": need + needed if temporaries and needed else needed,
                                    "temporaries": needed if temporaries else None,
                                    "at_least": bool(temporaries)},
                      compiler_message=str(err).strip().splitlines()[0][:500])
        return record
    record["compile_seconds"] = time.perf_counter() - start
    record["parameter_placement"] = _placement(compiled, step, state.params)
    chip = accelerator.chip
    if accelerator.platform == "cuda":
        chip = gpus.at_precision(chip, trainer.config.model.dtype,
                                 trainer.config.model.matmul_precision)
    record.update(figures.step_figures(compiled, chip, pairs, accelerator.chips))
    if accelerator.platform == "cuda":
        record["peak"] = {"name": chip.peak_name, "flops_per_second": chip.peak_flops}
    if record["cost"] is None:
        counted = count.step_flops(trainer.config, encoders.encoder_config(trainer.config),
                                   step, record["batch_sizes"])
        record.update(figures.counted_cost(counted / accelerator.chips, record["memory_bytes"],
                                           chip, pairs, accelerator.chips))
    return record


def compile_steps(config, accelerator: chips_lib.Accelerator, steps=("train", "eval")
                  ) -> list[dict[str, Any]]:
    """``compile_step`` of each of ``steps`` at the config's batch sizes (train.batch_size;
    train.eval_batch_size rounded up to the mesh as evaluation does), up to the first that
    does not fit."""
    accelerator = on_devices(accelerator)
    trainer = build(config, accelerator)
    pairs = {"train": config.train.batch_size,
             "eval": eval_batch_size(config.train.eval_batch_size, trainer.mesh)}
    records = []
    for step in steps:
        records.append(compile_step(trainer, step, pairs[step], accelerator))
        if not records[-1]["fits"]:
            break
    return records


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f} GiB"


def _unit(record: dict[str, Any]) -> str:
    """What a record's figures are per: "chip" (TPU) or "GPU"."""
    return "GPU" if record.get("platform") == "cuda" else "chip"


def _peak(record: dict[str, Any]) -> str:
    """", at the tf32 peak" where a GPU's roofline takes another peak than bf16."""
    peak = record.get("peak")
    return f" at the {peak['name']} peak" if peak and peak["name"] != "bf16" else ""


def describe(record: dict[str, Any]) -> str:
    """One terminal line of a step's record: every figure compile-time."""
    mesh = " x ".join(f"{k}={v}" for k, v in record["mesh"].items())
    head = (f"{record['step']} step, {record['pairs']} pairs on {record['accelerator']} "
            f"({record['chips']} x {record['chip']}, mesh {mesh}): ")
    if record.get("refused_before_compiling"):
        head += "refused before compiling"
    elif record.get("compiler_message"):
        head += f"{record['compiler']} refused it after {record['compile_seconds']:.1f} s"
    else:
        head += f"compiled in {record['compile_seconds']:.1f} s"
        if record.get("compiler_options"):
            head += " (Triton GEMMs off: none tiled without a GPU)"
    mem, unit = record["memory_bytes"], _unit(record)
    fit = "fits" if record["fits"] else "DOES NOT FIT"
    if "generated_code" not in mem:
        least = "at least " if mem.get("at_least") else ""
        parts = ", ".join(f"{k} {_gib(mem[k])}" for k in ("arguments", "temporaries")
                          if mem.get(k) is not None)
        return (f"{head}; needs {least}{_gib(mem['total'])} of {_gib(record['hbm_bytes'])} a "
                f"{unit} ({parts}): {fit} [compile-time]")
    text = (f"{head}; per {unit} {_gib(mem['total'])} of {_gib(record['hbm_bytes'])} ({fit}: "
            f"arguments {_gib(mem['arguments'])}, outputs {_gib(mem['outputs'])}, temporaries "
            f"{_gib(mem['temporaries'])}, code {_gib(mem['generated_code'])})")
    if record.get("cost"):
        c, r = record["cost"], record["roofline"]
        loops = None if c.get("counted") else record.get("loop_trip_counts")
        once = (f", loop bodies counted once (trip counts {', '.join(map(str, loops))}): lower "
                "bounds" if loops else "")
        counted = (" (counted: the compiler gives none; bytes: arguments + outputs, a lower "
                   "bound)" if c.get("counted") else "")
        text += (f"; {c['flops']:.3g} FLOPs, {c['bytes_accessed']:.3g} bytes a {unit}{counted} "
                 f"({r['intensity_flops_per_byte']:.0f} FLOPs/byte, ridge "
                 f"{r['ridge_point']:.0f}{_peak(record)}: {r['bound']}-bound{once})")
    moved = {k: v for k, v in record["collectives"].items() if v["count"]}
    text += "; collectives " + (", ".join(f"{k} {v['count']} ({_gib(v['bytes'])})"
                                          for k, v in moved.items()) or "none")
    if record.get("roofline"):
        r = record["roofline"]
        text += (f"; roofline {r['step_seconds'] * 1e3:.2f} ms/step, "
                 f"<= {r['pairs_per_second']:.1f} pairs/s")
    return text + " [compile-time]"


def refusal(record: dict[str, Any], config) -> str:
    """The one line of a step that does not fit: what it needs, what the chip has, and the
    config keys that would shrink it."""
    keys = [f"--config.train.{'batch_size' if record['step'] == 'train' else 'eval_batch_size'}"
            f" (now {record['pairs']} pairs)",
            f"--config.mesh.fsdp (now {record['mesh']['fsdp']}: parameters and optimizer state "
            "over more devices)"]
    if not config.model.remat:
        keys.append("--config.model.remat=true")
    if config.model.dtype == "float32":
        keys.append("--config.model.dtype=bfloat16")
    least = "at least " if record["memory_bytes"].get("at_least") else ""
    unit = _unit(record)
    device = f"an {record['chip']}" if unit == "GPU" else f"a {record['chip']} chip"
    return (f"the {record['step']} step needs {least}{_gib(record['memory_bytes']['total'])} "
            f"per {unit}; "
            f"{device} of {record['accelerator']} has "
            f"{_gib(record['hbm_bytes'])}; shrink it with {', '.join(keys)}")


def run(config, workdir: str, accelerator_name: str) -> list[dict[str, Any]]:
    """The mode: compiles both steps (XLA:TPU or XLA:GPU), prints one line each, writes
    ``WORKDIR/compile/<type>.json`` and raises CompileError (the ``refusal`` line) for the
    first step that does not fit."""
    try:
        accelerator = targets.target(accelerator_name)
    except ValueError as err:
        raise CompileError(f"--topology: {err}") from None
    records = compile_steps(config, accelerator)
    for record in records:
        print(describe(record), flush=True)
    out = Path(workdir) / "compile" / f"{accelerator.name.replace(':', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"compile_time_figures": True, "jax": jax.__version__,
                               "records": records}, indent=1) + "\n")
    print(f"wrote {out}", flush=True)
    for record in records:
        if not record["fits"]:
            raise CompileError(refusal(record, config))
    return records
