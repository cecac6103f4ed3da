"""--mode=compile: the tiny config's steps compiled by XLA:TPU for v5e:2x2 from this CPU (libtpu's
topology, no TPU), its figures, the one-line refusal, and what keeps libtpu off elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trip_jax.compile import chips, figures
from trip_jax.runtime import platforms

# The tiny config on a 2 x 2 (data, fsdp) mesh of a v5e:2x2, one pair a chip.
MESH = ("--mode=compile", "--topology=v5e:2x2", "--config.mesh.data=2", "--config.mesh.fsdp=2",
        "--config.train.eval_batch_size=4")


@pytest.fixture(scope="module")
def compiled(run_main, tmp_path_factory):
    """The command's run (both steps, one compile each) and its JSON records."""
    workdir = tmp_path_factory.mktemp("compile")
    result = run_main(f"--workdir={workdir}", *MESH, "--config.train.batch_size=4", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads((workdir / "compile" / "v5e_2x2.json").read_text())["records"]
    return result, records


def test_both_steps_compile_with_positive_compile_time_figures(compiled):
    result, records = compiled
    assert [r["step"] for r in records] == ["train", "eval"]
    lines = [l for l in result.stdout.splitlines() if l.endswith("[compile-time]")]
    assert [l.split(" step,")[0] for l in lines] == ["train", "eval"]
    for r in records:
        assert r["chips"] == 4 and r["chip"] == "TPU v5 lite" and r["fits"]
        assert r["mesh"] == {"data": 2, "fsdp": 2} and r["pairs"] == 4
        assert r["compile_seconds"] > 0
        memory = r["memory_bytes"]
        assert memory["arguments"] > 0 and memory["generated_code"] > 0
        assert 0 < memory["total"] < r["hbm_bytes"] == 16 * 2 ** 30
        assert r["cost"]["flops"] > 0 and r["cost"]["bytes_accessed"] > 0
        assert r["roofline"]["step_seconds"] > 0 and r["roofline"]["pairs_per_second"] > 0
        # fsdp=2: parameters are gathered for the forward pass.
        assert r["collectives"]["all-gather"]["count"] > 0
        assert r["collectives"]["all-gather"]["bytes"] > 0
    train, evaluation = records
    assert train["cost"]["flops"] > evaluation["cost"]["flops"]  # backward pass and update


def test_parameters_are_placed_as_the_config_shards_them(compiled):
    from configs import tiny
    from trip_jax.runtime import sharding

    min_size = tiny.get_config().mesh.fsdp_min_size
    for record in compiled[1]:
        placement = record["parameter_placement"]
        expected = {path: list(sharding.param_spec(tuple(p["shape"]), 2, min_size))
                    for path, p in placement.items()}
        got = {path: p["spec"] + [None] * (len(p["shape"]) - len(p["spec"]))
               for path, p in placement.items()}
        expected = {path: s + [None] * (len(placement[path]["shape"]) - len(s))
                    for path, s in expected.items()}
        assert got == expected
        sharded = sum("fsdp" in s for s in got.values())
        assert sharded == record["parameters"]["sharded_arrays"] > 0
        assert record["parameters"]["replicated_arrays"] > 0


def test_a_batch_too_large_for_the_chip_is_one_line_exit_2(run_main, tmp_path):
    result = run_main(f"--workdir={tmp_path}", *MESH, "--config.train.batch_size=400000")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [l for l in result.stderr.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    line = errors[0]
    assert "the train step needs at least" in line and "16.00 GiB" in line
    for key in ("--config.train.batch_size (now 400000", "--config.mesh.fsdp",
                "--config.model.remat=true"):
        assert key in line
    assert "DOES NOT FIT" in result.stdout


@pytest.mark.parametrize("flags, says", [
    (("--mode=compile",), "--mode=compile needs --topology"),
    (("--topology=v5e-8",), "--topology: --mode=train does not read it"),
    (("--mode=compile", "--topology=v7x-8"), "unknown TPU accelerator type 'v7x-8'"),
    (("--mode=compile", "--topology=v5e-6"), "is not a slice size"),
])
def test_bad_compile_flags_are_one_line(run_main, tmp_path, flags, says):
    result = run_main(f"--workdir={tmp_path / 'run'}", *flags)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [next(
        l for l in result.stderr.splitlines() if l.startswith("error: "))]
    assert says in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_slice_with_other_than_one_device_a_chip_is_refused_and_small_slices_load(
        monkeypatch):
    from trip_jax.compile import run

    v4 = chips.accelerator("v4-8")
    monkeypatch.setattr(run, "topology_devices", lambda accelerator: (None,) * 8)
    with pytest.raises(run.CompileError, match="8 devices .* for 4 chips"):
        run.on_devices(v4)
    monkeypatch.undo()
    v5e = chips.accelerator("v5e-8")
    assert run.on_devices(v5e) == v5e
    assert [len(run.topology_devices(chips.accelerator(n))) for n in ("v5e-1", "v6e-2")] == [1, 2]


def test_v4_compiles_in_megacore_one_device_a_chip_with_the_chips_hbm():
    # libtpu's default v4 config has a device per TensorCore with half the HBM; megacore has
    # one a chip: 12 GiB in and 12 out a device fit a v4 chip (32 GiB), 20 and 20 do not.
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from trip_jax.compile import run

    v4 = chips.accelerator("v4-8")
    devices = run.topology_devices(v4)
    assert run.on_devices(v4) == v4 and len(devices) == 4
    assert {d.device_kind for d in devices} == {"TPU v4"}
    assert len({tuple(d.coords) for d in devices}) == 4

    def compiled(devices, gib):
        mesh = Mesh(np.array(devices), ("d",))
        x = jax.ShapeDtypeStruct((gib * 2 ** 28 * len(devices),), jnp.float32,
                                 sharding=NamedSharding(mesh, PartitionSpec("d")))
        return jax.jit(lambda a: a * 2).lower(x).compile()

    memory = compiled(devices, 12).memory_analysis()
    assert memory.argument_size_in_bytes == memory.output_size_in_bytes == 12 * 2 ** 30
    with pytest.raises(Exception, match=r"RESOURCE_EXHAUSTED.*available HBM \(30.75G\)"):
        compiled(devices, 20)
    per_core = topologies.get_topology_desc(v4.topology, "tpu").devices
    assert len(per_core) == 8
    with pytest.raises(Exception, match=r"RESOURCE_EXHAUSTED.*available HBM \(15.25G\)"):
        compiled(per_core, 12)


def tiny_train_step_on_v5e4(prng_impl: str):
    """The tiny config's train step built for v5e-4 with ``train.prng_impl=prng_impl``, lowered
    for 4 pairs: (config, lowered step, its batch shapes)."""
    from benchmarks import batch_search
    from trip_jax.compile import run, shapes

    config = batch_search.config_of("tiny", [f"train.prng_impl={prng_impl}"])
    trainer = run.build(config, run.on_devices(chips.accelerator("v5e-4")))
    batch = shapes.batch_spec(config, 4, 4)
    return config, trainer.train_step.lower(trainer.abstract_state, batch), batch


@pytest.mark.parametrize("prng_impl", ["threefry2x32", "rbg"])
def test_the_compiled_train_step_draws_dropout_with_the_configs_prng(prng_impl):
    import jax

    _, lowered, _ = tiny_train_step_on_v5e4(prng_impl)
    assert ("rng_bit_generator" in lowered.as_text()) == (prng_impl == "rbg")
    assert jax.config.jax_default_prng_impl == "threefry2x32"  # as it was


@pytest.mark.parametrize("prng_impl", ["rbg", "unsafe_rbg"])
def test_with_unsafe_rbg_each_chip_draws_only_its_own_dropout_bits(prng_impl):
    # XLA:TPU draws an RngBitGenerator's bits for the whole batch on every chip, then keeps the
    # chip's share (rbg); for unsafe_rbg the train step asks it to draw only the chip's share
    # (docs/compile.md#fsdp). On another platform the step asks nothing.
    import re

    import jax

    from trip_jax.runtime import sharding
    from trip_jax.training import step

    config, lowered, batch = tiny_train_step_on_v5e4(prng_impl)
    text = lowered.compile().as_text()
    drawn = {int(dims.split(",")[0]) for dims in
             re.findall(r"= u32\[([0-9,]+)\]\S* rng-bit-generator", text)}
    sequences = batch["input_ids"].shape[0]
    per_chip = prng_impl == "unsafe_rbg"
    assert (sequences // 4 in drawn, sequences in drawn) == (per_chip, not per_chip), drawn
    cpu_mesh = sharding.create_mesh(config.mesh, jax.devices("cpu")[:1])
    assert step.step_compiler_options(cpu_mesh, "unsafe_rbg") is None


def test_a_mesh_that_splits_the_torus_is_built():
    # v5e-256 is a 16x16 torus: data=32 x fsdp=8 splits its sides (mesh_utils refuses that
    # unless asked); training's create_mesh builds it.
    import ml_collections

    from trip_jax.compile import run
    from trip_jax.runtime import sharding

    devices = run.topology_devices(chips.accelerator("v5e-256"))
    mesh = sharding.create_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 8}), devices)
    assert dict(mesh.shape) == {"data": 32, "fsdp": 8} and mesh.devices.size == 256


def test_without_libtpu_the_command_says_so(monkeypatch):
    from trip_jax.compile import run

    monkeypatch.setattr(platforms, "installed", lambda module: module != "libtpu")
    run.topology_devices.cache_clear()
    with pytest.raises(run.CompileError, match=r"needs libtpu, which is not installed: pip "
                                               r"install -e '\.\[tpu\]'"):
        run.topology_devices(chips.accelerator("v5e-4"))


@pytest.mark.parametrize("name, topology, count", [
    ("v4-8", "v4:2x2x1", 4), ("v4-128", "v4:4x4x4", 64), ("v5p-8", "v5p:2x2x1", 4),
    ("v5p-128", "v5p:4x4x4", 64), ("v5e-8", "v5e:2x4", 8), ("v5litepod-8", "v5e:2x4", 8),
    ("v5e-256", "v5e:16x16", 256), ("v6e-8", "v6e:2x4", 8), ("v5e-1", "v5e:1x1", 1),
    ("v5e:2x2", "v5e:2x2", 4), ("v4-16", "v4:2x2x2", 8),
])
def test_accelerator_types_as_cloud_tpu_spells_them(name, topology, count):
    accelerator = chips.accelerator(name)
    assert (accelerator.topology, accelerator.chips) == (topology, count)


def test_collectives_are_counted_with_their_result_bytes():
    hlo = "\n".join([
        "  %ag = f32[8,16]{1,0} all-gather(f32[4,16]{1,0} %p), dimensions={0}",
        "  %ags = (bf16[4]{0}, bf16[8]{0}) all-gather-start(bf16[4]{0} %q)",
        "  %agd = bf16[8]{0} all-gather-done((bf16[4]{0}, bf16[8]{0}) %ags)",
        "  %ar = (f32[2]{0}, s32[3]{0}) all-reduce(f32[2]{0} %a, s32[3]{0} %b), to_apply=%add",
        "  %rs = f32[4]{0} reduce-scatter(f32[16]{0} %c), dimensions={0}",
    ])
    found = figures.collectives(hlo)
    assert found["all-gather"] == {"count": 2, "bytes": 8 * 16 * 4 + 8 * 2}
    assert found["all-reduce"] == {"count": 1, "bytes": 2 * 4 + 3 * 4}
    assert found["reduce-scatter"] == {"count": 1, "bytes": 16}


def test_loop_trip_counts_are_read_off_the_loop_conditions():
    # XLA:TPU's text of a 24-step lax.scan (its cost analysis counts the body once).
    hlo = "\n".join([
        "%cond.4 (arg: (s32[], f32[8])) -> pred[] {",
        "  %constant.14 = s32[]{:T(128)} constant(24)",
        "  %gte = s32[]{:T(128)} get-tuple-element(%arg), index=0",
        "  ROOT %lt.0 = pred[]{:T(512)} compare(%gte, %constant.14), direction=LT",
        "}",
        "ENTRY %main {",
        "  %while = (s32[]{:T(128)}, f32[8]{0}) while(%tuple.13), condition=%cond.4, body=%b.3",
        '  %w2 = (s32[]) while(%t), condition=%c, body=%b, backend_config={"known_trip_count":'
        '{"n":"6"}}',
        "}",
    ])
    assert figures.loop_trip_counts(hlo) == [6, 24]


def test_roofline_is_the_slower_of_compute_and_memory():
    chip = chips.CHIPS["v5e"]
    compute_bound = figures.roofline(chip.peak_flops, chip.hbm_bandwidth / 1000, chip, 8, 8)
    assert compute_bound["bound"] == "compute" and compute_bound["step_seconds"] == 1.0
    assert compute_bound["pairs_per_second"] == 8 and compute_bound["intensity_over_ridge"] > 1
    memory_bound = figures.roofline(1.0, 2 * chip.hbm_bandwidth, chip, 4, 2)
    assert memory_bound["bound"] == "memory" and memory_bound["step_seconds"] == 2.0
    assert memory_bound["pairs_per_second_per_chip"] == 1.0


def _fake_pci(root: Path, devices: dict[str, tuple[str, str]]) -> str:
    for name, (vendor, device) in devices.items():
        (root / name).mkdir(parents=True)
        (root / name / "vendor").write_text(vendor + "\n")
        (root / name / "device").write_text(device + "\n")
    return str(root)


def test_tpu_chips_are_found_on_pci(tmp_path):
    root = _fake_pci(tmp_path, {"0000:00:04.0": ("0x1ae0", "0x0063"),
                                "0000:00:05.0": ("0x1ae0", "0x0063"),
                                "0000:00:06.0": ("0x1ae0", "0x9999"),
                                "0000:00:07.0": ("0x8086", "0x0063")})
    assert platforms.tpu_chips(root) == 2
    assert platforms.attached_platforms(root) == "tpu,cpu"


def test_an_installed_libtpu_without_a_tpu_is_not_started(monkeypatch, tmp_path):
    monkeypatch.setattr(platforms, "installed", lambda module: module == "libtpu")
    monkeypatch.setattr(platforms, "NVIDIA_DEVICE_FILES", ())
    monkeypatch.setattr(platforms, "tpu_chips", lambda root="": 0)
    environ: dict[str, str] = {}
    assert platforms.skip_absent_tpu(environ) == "cpu" and environ == {"JAX_PLATFORMS": "cpu"}
    chosen = {"JAX_PLATFORMS": "tpu"}
    assert platforms.skip_absent_tpu(chosen) is None and chosen == {"JAX_PLATFORMS": "tpu"}
    monkeypatch.setattr(platforms, "tpu_chips", lambda root="": 4)
    assert platforms.skip_absent_tpu(environ := {}) is None and environ == {}
    monkeypatch.setattr(platforms, "installed", lambda module: False)
    monkeypatch.setattr(platforms, "tpu_chips", lambda root="": 0)
    assert platforms.skip_absent_tpu(environ := {}) is None and environ == {}


def test_batch_shapes_bound_the_largest_pair_in_each_layout():
    from configs import roberta
    from trip_jax.compile import shapes
    from trip_jax.config.typed import typed

    exact = typed(roberta.get_config())  # packed_tokens, rows cut at 16, no dedup
    sizes = shapes.batch_sizes(exact, 8, 4)
    largest = shapes.LARGEST_PAIR
    assert sizes["R"] == 8 * largest["rows"] and sizes["K"] == 8 * largest["tracks"]
    per_piece = 2 * largest["tokens"][16] // (64 - 16 + 1) + 1
    assert sizes["N"] == 4 * per_piece and sizes["E"] == 27 and sizes["P"] == 64
    assert sizes["N"] * 64 >= 8 * largest["tokens"][16]  # room for every token
    dense = roberta.get_config()
    dense.data.layout, dense.data.entity_padding, dense.data.max_length = "dense", "bucket", 0
    sizes = shapes.batch_sizes(typed(dense), 2, 2)
    assert (sizes["E"], sizes["T"]) == (28, 40) and sizes["R"] == 2 * 2 * 28 * 7
    spec = shapes.batch_spec(typed(dense), 2, 2)
    assert spec["input_ids"].shape == (sizes["R"], 40) and spec["pre_label"].shape[-1] == 20
    with pytest.raises(ValueError, match="do not split"):
        shapes.batch_sizes(exact, 6, 4)


def test_the_committed_compile_table_is_its_records_and_the_readmes():
    from benchmarks import tpu_compile

    repo = Path(__file__).resolve().parents[1]
    result = json.loads((repo / "benchmarks" / "results" / "tpu_compile.json").read_text())
    assert result["compile_time_figures"] is True
    assert result["markdown"] == tpu_compile.table(result["records"])
    assert result["markdown"] in (repo / "benchmarks" / "README.md").read_text()
    for record in result["records"]:
        assert chips.accelerator(record["accelerator"]).chips == record["chips"]
        assert record["fits"] == (record["memory_bytes"]["total"] <= record["hbm_bytes"])


def test_the_tpu_batch_search_is_the_gpu_one_and_reuses_the_records_on_file(monkeypatch,
                                                                             tmp_path):
    """benchmarks/tpu_compile.py searches with benchmarks/batch_search.py (as gpu_compile.py
    does), compiles only what its output file lacks and marks the largest batch that fits."""
    import types

    from benchmarks import batch_search, gpu_compile, tpu_compile
    from trip_jax.compile import run, targets

    assert gpu_compile.largest is batch_search.largest
    accelerator = types.SimpleNamespace(chips=8, chip=types.SimpleNamespace(hbm_bytes=100))
    compiled = []

    def compile_step(trainer, step, pairs, acc):
        compiled.append((step, pairs // 8))
        total = 10 + 3 * pairs // 8
        return {"step": step, "accelerator": "v5e-8", "chips": 8, "pairs": pairs,
                "compile_seconds": 1.0, "hbm_bytes": 100, "fits": total <= 100,
                "memory_bytes": {"total": total}}

    monkeypatch.setattr(batch_search, "config_of", lambda name, overrides: None)
    monkeypatch.setattr(targets, "target", lambda name: name)
    monkeypatch.setattr(run, "on_devices", lambda target: accelerator)
    monkeypatch.setattr(run, "build", lambda config, acc: None)
    monkeypatch.setattr(run, "compile_step", compile_step)
    monkeypatch.setattr(run, "describe", lambda record: "")
    out = tmp_path / "out.json"
    tpu_compile.measure("tiny", "v5e-8", ["train"], [], 1, out=str(out))
    assert compiled == [("train", 1)]
    tpu_compile.measure("tiny", "v5e-8", ["train"], [], 64, out=str(out))
    assert compiled[0] == ("train", 1) and compiled.count(("train", 1)) == 1  # reused
    records = json.loads(out.read_text())["records"]
    assert [r["pairs_per_chip"] for r in records if r.get("largest_that_fits")] == [30]
    assert len(records) == len(compiled) <= 5
    assert json.loads(out.read_text())["markdown"] == tpu_compile.table(records)
    assert "| 30 (largest) |" in tpu_compile.table(records)
