"""The GPU check (``benchmarks.gpu_check``) on CPU: its grid, its time budget, its parity report,
and the whole check at smoke size (every case a 2-layer width-64 model, one step, 4 dev pairs) in
this process. No timing is asserted: the CPU is shared.
"""

from __future__ import annotations

import itertools
import json

import pytest

from benchmarks import cases, gpu_check
from configs import base

JAX_FIELDS = {"compile_s", "first_call_s", "step_s", "pairs_per_s", "model_flops",
              "model_flops_per_s", "mfu", "xla_flops"}
TORCH_FIELDS = {"first_run_s", "step_s", "pairs_per_s", "model_flops", "mfu"}
GOALS = [goal[0] for goal in cases.GPU_GOALS]


pytestmark = pytest.mark.usefixtures("benchmark_env")


def test_grid_is_the_reference_then_the_paper_config_then_large_bf16():
    grid = cases.gpu_check_grid()
    torch = [(c.batch_size, c.dtype) for c in grid.cases if c.layout in cases.TORCH_LAYOUTS]
    assert torch == [(1, "float32"), (8, "bfloat16")]
    [paper] = [c for c in grid.cases if c.model == "large_exact"]
    assert (paper.layout, paper.batch_size, paper.dtype, paper.batch) == (
        "config", 1, "float32", "largest")
    packed = [c.batch_size for c in grid.cases if c.layout == "packed_tokens"]
    assert packed == [8, 16, 32]
    # One init per model: a model's cases are adjacent.
    keys = [key for key, _ in itertools.groupby(map(gpu_check.group_key, grid.cases))]
    assert len(keys) == len(set(keys)) == 3
    exact = cases.model_config("large_exact", dtype=paper.dtype)
    assert base.fidelity_of(exact) == "exact" and exact.model.dtype == "float32"
    assert exact.model.random_encoder == cases.model_config("large").model.random_encoder
    large = cases.model_config("large")
    assert large.model.dtype == "bfloat16"
    assert (large.model.random_encoder.hidden_size,
            large.model.random_encoder.num_hidden_layers) == (1024, 24)


def test_smoke_grid_shrinks_every_case():
    smoke = cases.gpu_check_grid(smoke=True)
    assert {c.model for c in smoke.cases} == {"smoke_large", "smoke_large_exact"}
    assert all(c.max_pairs == 4 and c.iters == 1 and c.batch_size <= 2 for c in smoke.cases)
    # A trip-jax model's later cases evaluate the state its earlier train steps left.
    packed = [(c.batch_size, c.modes) for c in smoke.cases if c.layout == "packed_tokens"]
    assert packed == [(1, ("eval", "train")), (2, ("eval",))]
    for name in ("smoke_large_exact", "smoke_large"):
        config = cases.model_config(name)
        assert config.model.random_encoder.num_hidden_layers == 2
        assert config.model.tiered.detector_layers == 1  # compiles in seconds


def test_a_spent_budget_skips_every_case_with_a_note(tmp_path):
    out = tmp_path / "check.json"
    results = gpu_check.main(["--smoke", "--budget-s", "0", "--parity", "last",
                              "--out", str(out)])
    assert json.loads(out.read_text())["skipped"] == results["skipped"]
    assert results["cases"] == [] and results["matmul_peak"]["start"] == {}
    assert len(results["skipped"]) == len(cases.gpu_check_grid(smoke=True).cases)
    assert all(s["reason"].startswith("time budget") for s in results["skipped"])
    assert results["parity_tests"]["not_run"].endswith("of the budget left")
    assert [g["met"] for g in results["goals"]] == [None] * len(GOALS)


def test_parity_summary_reads_pytest_verbose_output():
    output = """============ test session starts ============
tests/test_a.py::test_ok PASSED                                  [ 20%]
tests/test_a.py::test_bad[float32-2] FAILED                      [ 40%]
tests/test_b.py::test_broken ERROR                               [ 60%]
tests/test_b.py::test_later SKIPPED (no GPU)                     [ 80%]
FAILED tests/test_a.py::test_bad[float32-2] - AssertionError
"""
    assert gpu_check.parity_summary(output) == {
        "passed": 1, "failed": 1, "errors": 1, "skipped": 1,
        "failed_names": ["tests/test_a.py::test_bad[float32-2]", "tests/test_b.py::test_broken"]}


def test_smoke_check_records_every_case(tmp_path):
    out = tmp_path / "check.json"
    # No budget: every case runs however slow the machine is (the budget's cut is tested by
    # test_a_spent_budget_skips_every_case_with_a_note, without the clock).
    results = gpu_check.main(["--smoke", "--parity", "skip", "--budget-s", "inf",
                              "--out", str(out)])
    assert json.loads(out.read_text())["cases"] == results["cases"]
    grid = cases.gpu_check_grid(smoke=True)
    assert results["complete"] and results["skipped"] == []
    assert set(results["matmul_peak"]["best_flops_per_s"]) == {"bfloat16", "float32"}
    assert len(results["cases"]) == len(grid.cases)
    previous = None
    for case, record in zip(grid.cases, results["cases"]):
        assert "error" not in record, record.get("traceback_tail")
        assert (record["model"], record["layout"], record["batch_size"]) == (
            case.model, case.layout, case.batch_size)
        # A model is built on its group's first case only.
        key = gpu_check.group_key(case)
        assert record["model_built"] == (key != previous)
        previous = key
        torch = case.layout in cases.TORCH_LAYOUTS
        for mode in case.modes:
            fields = TORCH_FIELDS if torch else JAX_FIELDS
            assert fields <= record[mode].keys(), fields - record[mode].keys()
            assert record[mode]["step_s"] > 0 and record[mode]["mfu"] > 0
        if torch:
            assert record["device"] == "cpu" and record["autocast"] == (
                case.dtype == "bfloat16")
        else:
            assert record["dtype"] == (case.dtype or "bfloat16")
    goals = {g["target"]: g for g in results["goals"]}
    assert list(goals) == GOALS
    assert goals["paper_train_compile_s"]["measured"] == next(
        r["train"]["compile_s"] for r in results["cases"] if r["layout"] == "config")
    best_clean = max(r["train"]["pairs_per_s"] for r in results["cases"]
                     if r["layout"] == "packed_tokens" and "train" in r)
    best_torch = max(r["train"]["pairs_per_s"] for r in results["cases"]
                     if r["layout"] == "torch_padded")
    assert goals["train_x_torch_best"]["measured"] == pytest.approx(best_clean / best_torch)
    assert goals["parity_failures"]["met"] is None
    assert results["parity_tests"] == {"not_run": "--parity skip"}
    assert "Goals (issue #42" in results["markdown"]
    assert "| MFU of that clean train step |" in results["markdown"]
    assert "| >= 40% |" in results["markdown"]
    assert "| smoke_large bfloat16 | packed_tokens | 1 | train |" in results["markdown"]


def test_minilm_weights_missing_deselects_their_parity_test(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check.minilm, "model_dir", lambda: str(tmp_path))
    assert set(gpu_check.deselected_parity_tests()) == set(gpu_check.NEEDS_MINILM_WEIGHTS)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert gpu_check.deselected_parity_tests() == {}


def test_models_narrow_the_grid(tmp_path):
    # An empty list keeps no case (the parity tests alone, here skipped too).
    results = gpu_check.main(["--smoke", "--models", "", "--parity", "skip",
                              "--out", str(tmp_path / "check.json")])
    assert results["cases"] == [] and results["skipped"] == [] and results["complete"]
