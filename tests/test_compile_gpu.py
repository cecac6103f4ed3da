"""--mode=compile for NVIDIA GPUs without the CUDA plugin: names, the target config written from
public figures, the one-line refusal without the plugin, the roofline, the batch search. The
compiles themselves need the plugin (benchmarks/gpu_compile.py records them; docs/compile.md)."""

from __future__ import annotations

import pytest

from trip_jax.compile import chips, figures, gpus, targets
from trip_jax.runtime import platforms


@pytest.mark.parametrize("name, gpu, topology, count", [
    ("h100", "h100", "1x1x1", 1), ("h100x8", "h100", "1x1x8", 8),
    ("2xh100x8", "h100", "2x1x8", 16), ("h200", "h200", "1x1x1", 1),
    ("H200x8", "h200", "1x1x8", 8), ("a100x4", "a100", "1x1x4", 4),
])
def test_gpu_nodes_are_named_as_gpus_a_node_and_nodes(name, gpu, topology, count):
    node = targets.target(name)
    assert (node.platform, node.topology, node.chips) == ("cuda", topology, count)
    assert node.chip is gpus.GPUS[gpu]


def test_tpu_names_still_reach_tpus_and_bad_gpu_names_are_refused():
    assert targets.target("v5e-8") == chips.accelerator("v5e-8")
    assert targets.target("v5e-8").platform == "tpu"
    with pytest.raises(ValueError, match="unknown GPU 'h300'.*h100, h200, a100"):
        targets.target("h300")
    with pytest.raises(ValueError, match="NODESxGPUxPER_NODE"):
        targets.target("2xh100")


def test_the_h100_target_config_holds_its_public_figures():
    text = gpus.target_config(gpus.GPUS["h100"], (9, 8, 0))
    for line in ("core_count: 132", "fpus_per_core: 128", "clock_rate_ghz: 1.98",
                 "memory_bandwidth: 3350000000000", "device_memory_size: 80000000000",
                 "l2_cache_size: 52428800", "threads_per_block_limit: 1024",
                 "shared_memory_per_block_optin: 232448", "registers_per_core_limit: 65536",
                 "cuda_compute_capability { major: 9 minor: 0 }", 'platform_name: "CUDA"',
                 "dnn_version_info { major: 9 minor: 8 patch: 0 }",
                 'device_description_str: "NVIDIA H100 80GB HBM3"'):
        assert line in text
    assert text.startswith("gpu_device_info {") and text.count("{") == text.count("}")
    assert "major: 8 minor: 0" in gpus.target_config(gpus.GPUS["a100"])
    # The clock is the one the fp32 peak implies: SMs x fp32 lanes x 2 x clock.
    for gpu in gpus.GPUS.values():
        assert gpu.sms * gpu.fp32_lanes_per_sm * 2 * gpu.clock_ghz * 1e9 == pytest.approx(
            gpu.peak_fp32, rel=0.01)


def test_without_the_cuda_plugin_the_command_says_so_in_one_line(run_main, tmp_path,
                                                                 monkeypatch):
    from trip_jax.compile import run

    has_plugin = platforms.installed(run.CUDA_PLUGIN)
    monkeypatch.setattr(platforms, "installed", lambda module: module != run.CUDA_PLUGIN)
    with pytest.raises(run.CompileError, match=r"needs the CUDA plugin, which is not installed: "
                                               r"pip install -e '\.\[cuda\]'"):
        run.topology_devices(targets.target("h100x8"))
    if has_plugin:
        return  # the command below would compile
    result = run_main(f"--workdir={tmp_path}", "--mode=compile", "--topology=h100")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "pip install -e '.[cuda]'" in errors[0]


def test_the_gpu_roofline_takes_the_peak_of_the_configs_precision():
    h100 = gpus.GPUS["h100"]
    assert gpus.at_precision(h100, "bfloat16", "highest").peak_flops == 989.5e12
    assert gpus.at_precision(h100, "float32", "highest").peak_name == "fp32"
    assert gpus.at_precision(h100, "float32", "default").peak_flops == 494.5e12
    memory = {"arguments": 2 * 10 ** 9, "outputs": 10 ** 9}
    out = figures.counted_cost(1e13, memory, h100, pairs=8, chips=1)
    assert out["cost"] == {"flops": 1e13, "bytes_accessed": 3e9, "counted": True}
    roof = out["roofline"]
    assert roof["bound"] == "compute" and roof["step_seconds"] == pytest.approx(1e13 / 989.5e12)
    assert roof["pairs_per_second"] == pytest.approx(8 / (1e13 / 989.5e12))
    slow = figures.counted_cost(1e10, memory, gpus.at_precision(h100, "float32", "highest"), 8, 8)
    assert slow["roofline"]["bound"] == "memory"
    assert slow["roofline"]["step_seconds"] == pytest.approx(3e9 / 3.35e12)
    assert slow["roofline"]["pairs_per_second_per_chip"] == pytest.approx(1 / (3e9 / 3.35e12))


def test_the_batch_search_finds_the_largest_fitting_batch_in_few_compiles():
    from benchmarks import gpu_compile

    for base, per_pair, hbm, best in ((10, 3, 100, 29), (10, 3, 1000, 64), (200, 3, 100, 0),
                                      (5, 7, 100, 13)):
        compiled = []

        def compile_at(pairs):
            compiled.append(pairs)
            total = base + per_pair * pairs + (pairs > 20)  # not quite a line
            return {"fits": total <= hbm, "memory_bytes": {"total": total}}

        found, records = gpu_compile.largest(compile_at, hbm, 64)
        assert found == best and len(records) == len(compiled) <= 5
        assert len(set(compiled)) == len(compiled)


def test_an_installed_gpu_plugin_without_a_gpu_is_not_started(monkeypatch):
    monkeypatch.setattr(platforms, "installed", lambda module: module == "jax_cuda12_plugin")
    monkeypatch.setattr(platforms, "NVIDIA_DEVICE_FILES", ())
    monkeypatch.setattr(platforms, "tpu_chips", lambda root="": 0)
    assert platforms.skip_absent_tpu(environ := {}) == "cpu" and environ == {"JAX_PLATFORMS": "cpu"}
    monkeypatch.setattr(platforms, "NVIDIA_DEVICE_FILES", ("/",))
    assert platforms.skip_absent_tpu(environ := {}) == "cuda,cpu"


def test_the_committed_gpu_compile_table_is_its_records_and_the_readmes():
    import json
    from pathlib import Path

    from benchmarks import gpu_compile

    repo = Path(__file__).resolve().parents[1]
    result = json.loads((repo / "benchmarks" / "results" / "gpu_compile.json").read_text())
    assert result["compile_time_figures"] is True and result["compiler"] == "XLA:GPU"
    assert result["markdown"] == gpu_compile.table(result["records"])
    assert result["markdown"] in (repo / "benchmarks" / "README.md").read_text()
    for record in result["records"]:
        assert targets.target(record["accelerator"]).chips == record["chips"]
        assert record["fits"] == (record["memory_bytes"]["total"] <= record["hbm_bytes"])
        assert record["platform"] == "cuda" and (record.get("cost") or {}).get("counted", True)
