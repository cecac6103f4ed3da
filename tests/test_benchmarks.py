"""The benchmark harness end to end at smoke size: the JSON it writes has every expected field.

Runs ``python -m benchmarks.run --smoke`` (tiny model, 4 dev pairs, one step per timing; the
trip-jax cases, the eager PyTorch reference's and their ratios) on CPU, on the shared TRIP data
(the GPU check's smoke test: tests/test_gpu_check.py). No timing is asserted: the CPU is shared.
The session's compilation cache and the tests' compile flags (conftest) keep the run short.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from benchmarks import (cases, compile_seconds, flops, report, run, step_profile, train_speed,
                        unroll_encoder)
from trip_jax.config.typed import replace, typed
from trip_jax.models.tiered import TieredConfig

TORCH_FIELDS = {"first_run_s", "step_s", "step_s_all", "pairs_per_s", "real_rows_per_s",
                "tokens_per_s", "model_flops", "mfu", "cpu_user_s_per_step",
                "cpu_sys_s_per_step"}
TIMED_FIELDS = {"compile_s", "first_call_s", "step_s", "pairs_per_s", "real_rows_per_s",
                "tokens_per_s", "model_flops", "model_flops_per_s", "mfu", "xla_flops",
                "cpu_user_s_per_step", "cpu_sys_s_per_step"}


pytestmark = pytest.mark.usefixtures("benchmark_env")


def run_smoke(tmp_path, cache_dir, *flags) -> dict:
    """Runs a smoke grid with the session's compilation cache; returns the JSON written (and
    checks it equals the return value)."""
    out = tmp_path / "results.json"
    returned = run.main(["--smoke", "--out", str(out), "--compile-cache", str(cache_dir),
                         *flags])
    written = json.loads(out.read_text())
    assert written["grid"] == returned["grid"]
    return written


def check_case(case: dict, layout: str, modes: tuple[str, ...]) -> None:
    assert "error" not in case, case.get("stderr_tail")
    assert case["layout"] == layout
    batch = case["batch"]
    assert 0 < batch["real_rows"] <= batch["encoder_rows"]
    assert 0 < batch["encoded_real_tokens"] <= min(batch["real_tokens"], batch["encoder_tokens"])
    for mode in modes:
        timed = case[mode]
        assert TIMED_FIELDS <= timed.keys(), TIMED_FIELDS - timed.keys()
        assert timed["step_s"] > 0 and timed["compile_s"] > 0
        assert timed["model_flops"] > 0 and 0 < timed["mfu"]
        assert case["memory"][f"rss_peak_after_{mode}_mib"] >= case["memory"][
            "rss_after_setup_mib"] > 0
    # A train step is three forward passes of the same rows.
    if "train" in modes and "eval" in modes:
        assert case["train"]["model_flops"] == pytest.approx(3 * case["eval"]["model_flops"])
    summary = case["epoch_layout"]
    for name in ("packed_tokens", "dense", "reference_dense"):
        assert 0 < summary[name]["real_row_fraction"] <= 1
        assert summary[name]["distinct_shapes"] >= 1


def check_torch_case(case: dict, layout: str) -> None:
    assert "error" not in case, case.get("stderr_tail")
    assert case["layout"] == layout and case["framework"] == "torch"
    assert case["pairs_per_step"] == "batched" and case["threads"] >= 1
    batch = case["batch"]
    assert batch["pairs"] == 1
    assert 0 < batch["real_rows"] < batch["encoder_rows"]
    assert 0 < batch["real_tokens"] < batch["encoder_tokens"]
    assert batch["packing_efficiency"] == pytest.approx(
        batch["real_tokens"] / batch["encoder_tokens"])
    for mode in ("eval", "train"):
        timed = case[mode]
        assert TORCH_FIELDS <= timed.keys(), TORCH_FIELDS - timed.keys()
        assert timed["step_s"] > 0 and timed["pairs_per_s"] == pytest.approx(1 / timed["step_s"])
        assert case["memory"][f"rss_peak_after_{mode}_mib"] >= case["memory"][
            "rss_after_setup_mib"] > 0


def test_cpu_smoke_results(tmp_path, compilation_cache_dir):
    results = run_smoke(tmp_path, compilation_cache_dir)
    assert results["grid"] == "smoke"
    assert results["matmul_peak"]["best_flops_per_s"]["float32"] > 0
    assert len(results["load_average"]["start"]) == 3
    by_layout = {c["layout"]: c for c in results["cases"]}
    packed, reference = by_layout["packed_tokens"], by_layout["reference_dense"]
    torch_padded, torch_rows = by_layout["torch_padded"], by_layout["torch_rows"]
    check_case(packed, "packed_tokens", ("eval", "train"))
    check_case(reference, "reference_dense", ("eval",))
    assert packed["batch"]["pairs"] == 2 and reference["batch"]["pairs"] == 1
    # The reference pads to the data's largest story: more encoder rows than real ones.
    assert reference["batch"]["encoder_rows"] > reference["batch"]["real_rows"]
    ratios = {(r["layout"], r["mode"]): r for r in results["ratios"]}
    ratio = ratios[("packed_tokens", "eval")]
    assert ratio["ratio"] == pytest.approx(
        ratio["packed_pairs_per_s"] / ratio["reference_pairs_per_s"])

    # The PyTorch reference on the pair of the reference-layout case: padded, every cell of
    # the data-maximum grid a row of 16 tokens; rows, the real rows (at the dense layout's
    # bucketed T) plus the one padding row.
    check_torch_case(torch_padded, "torch_padded")
    check_torch_case(torch_rows, "torch_rows")
    real_rows = reference["batch"]["real_rows"]
    assert torch_padded["batch"]["real_rows"] == torch_rows["batch"]["real_rows"] == real_rows
    assert torch_padded["batch"]["seq_len"] == 16
    assert torch_padded["batch"]["grid_shape"] == reference["batch"]["grid_shape"]
    assert torch_padded["batch"]["encoder_rows"] == reference["batch"]["grid_slots"]
    assert torch_rows["batch"]["encoder_rows"] == real_rows + 1
    # Every timed trip-jax mode over both torch layouts' pairs/s, same model and mode.
    torch_ratios = {(r["layout"], r["batch_size"], r["mode"]): r for r in results["torch_ratios"]}
    assert set(torch_ratios) == {(c["layout"], c["batch_size"], mode) for c in by_layout.values()
                                 if c["layout"] not in cases.TORCH_LAYOUTS
                                 for mode in ("eval", "train") if mode in c}
    assert {("packed_tokens", 2, "train"), ("reference_dense", 1, "eval")} <= set(torch_ratios)
    for (layout, _, mode), r in torch_ratios.items():
        jax_case = by_layout[layout]
        for torch_case in (torch_padded, torch_rows):
            name = torch_case["layout"]
            assert r[f"{name}_batch_size"] == 1
            assert r[f"x_{name}"] > 0 and r[f"x_{name}"] == pytest.approx(
                jax_case[mode]["pairs_per_s"] / torch_case[mode]["pairs_per_s"])
    assert results["targets"] == []  # MiniLM's: not in the smoke grid
    [curve] = results["epoch_curves"]
    assert "error" not in curve, curve.get("stderr_tail")
    assert [(p["repeat"], p["pairs"]) for p in curve["points"]] == [(1, 4), (2, 8)]
    # Every shape is compiled before the timed epochs, so they compile nothing new.
    assert curve["compile"]["shapes"] >= curve["compile"]["shapes_in_first_epoch"] >= 1
    assert [p["new_shapes"] for p in curve["points"]] == [0, 0]
    assert curve["first_epoch_s"] > curve["points"][0]["epoch_s"]
    assert set(curve["fit"]) == {"s_per_pair", "fixed_s"}
    assert "| tiny | packed_tokens | 2 | train |" in results["markdown"]
    assert "| tiny | torch_rows | 1 | train |" in results["markdown"]
    assert "| x torch padded | x torch rows |" in results["markdown"]
    # The epoch table: today's layouts only (the retired packed layout's column: old records).
    assert "| model | B | packed_tokens | dense (bucketed E) | reference |" in results["markdown"]
    eval_ratio = torch_ratios[("reference_dense", 1, "eval")]
    assert f"| {eval_ratio['x_torch_padded']:.2f}x | {eval_ratio['x_torch_rows']:.2f}x |" in (
        results["markdown"])


def _minilm_case(layout: str, batch_size: int, step_s: float, rss_mib: float) -> dict:
    """A results record with what the targets read (a train step per pair of ``step_s``)."""
    timed = {"step_s": step_s, "pairs_per_s": batch_size / step_s}
    return {"model": "minilm", "layout": layout, "batch_size": batch_size, "remat": False,
            "train": timed, "eval": {"step_s": step_s / 4, "pairs_per_s": 4 * batch_size / step_s},
            "memory": {"rss_peak_after_train_mib": rss_mib}}


def test_targets_say_met_or_by_how_much_missed():
    records = [_minilm_case("packed_tokens", 1, 2.0, 3000),
               _minilm_case("packed_tokens", 8, 12.0, 6144),
               _minilm_case("torch_padded", 1, 6.0, 2000),
               _minilm_case("torch_rows", 1, 1.6, 2000),
               _minilm_case("reference_dense", 1, 5.0, 3000)]
    ratios = run.torch_ratios(records)
    targets = {t["target"]: t for t in run.targets(records, ratios)}
    assert {t["layout"] for t in run.targets(records, ratios)} == {"packed_tokens"}
    # 6.0 / 2.0 = 3x the padded step: 25% short of 4x; 1.6 / 2.0 = 0.8x the rows step.
    assert targets["train_x_torch_padded"]["measured"] == pytest.approx(3.0)
    assert targets["train_x_torch_padded"]["missed_by"] == pytest.approx(0.25)
    assert targets["train_x_torch_rows"]["missed_by"] == pytest.approx(0.2)
    assert targets["eval_x_torch_padded"]["met"] is False
    # Batch 8: 1.5 s a pair against 2.0 s at batch 1 (met); 6 GiB peak, 50% over 4 GiB.
    assert targets["b8_train_s_per_pair"]["met"] is True
    assert targets["b8_train_s_per_pair"]["bound"] == pytest.approx(2.0)
    assert targets["b8_peak_rss_gib"]["measured"] == pytest.approx(6.0)
    assert targets["b8_peak_rss_gib"]["missed_by"] == pytest.approx(0.5)
    rows = report.target_rows(list(targets.values()))
    assert [r[-1] for r in rows] == ["missed by 25%", "missed by 20%", "missed by 25%", "met",
                                     "missed by 50%"]
    # Without a batch 8 case those targets are "not timed", not met.
    targets = run.targets(records[:1] + records[2:], ratios)
    assert [r[-1] for r in report.target_rows(targets)][-2:] == ["not timed", "not timed"]


def test_layout_table_sets_config_keys_and_batch_sizes():
    config = replace(typed(cases.model_config("tiny")),
                     {"data.layout": "dense", "model.tiered.detector_layers": 3})
    assert config.data.layout == "dense" and config.model.tiered.detector_layers == 3
    assert cases.LAYOUTS["packed_tokens"].overrides == {
        "data.layout": "packed_tokens", "data.seq_len": 0, "model.tiered.cells": "real"}
    assert [n for n, spec in cases.LAYOUTS.items() if spec.baseline] == [cases.REFERENCE_LAYOUT]
    assert not set(cases.LAYOUTS) & set(cases.TORCH_LAYOUTS)
    with pytest.raises(ValueError, match="one pair a batch"):
        train_speed.run_case({"model": "tiny", "layout": "reference_dense", "batch_size": 2})
    with pytest.raises(ValueError, match="unknown layout"):
        train_speed.run_case({"model": "tiny", "layout": "torch_rows", "batch_size": 1})


def test_encoder_flops_formula():
    class Config:
        hidden_size, intermediate_size, num_hidden_layers, model_type = 4, 8, 2, "bert"

    class Gated(Config):
        model_type = "modernbert"  # its unit says gated: three h x i matrices

    n = flops.encoder_matmul_params(Config)
    assert n == 2 * (4 * 16 + 2 * 4 * 8)
    assert flops.encoder_matmul_params(Gated) == 2 * (4 * 16 + 3 * 4 * 8)
    # Two rows of 3 tokens: matmuls 2·N per token, attention 4·L·H·T² per row.
    assert flops.encoder_forward_flops(Config, [3, 3]) == 2 * n * 6 + 2 * (4 * 2 * 4 * 9)
    assert flops.heads_detector_forward_flops(4, TieredConfig(), 0, 7) == 0



def test_step_equations_do_not_grow_with_depth():
    # Layers scanned: 2 and 4 encoder layers trace to programs of one size (step_profile
    # --equations, which traces the real steps on the train state's shapes, compiling nothing).
    two, four = (step_profile.equation_counts(name, "packed_tokens", 1)
                 for name in ("smoke_large_l2", "smoke_large_l4"))
    assert (two["encoder_layers"], four["encoder_layers"]) == (2, 4)
    for key in ("train_step", "eval_step", "parameter_arrays"):
        assert two[key] == four[key], key
    assert two["train_step"] > 1000 and two["dtype"] == "bfloat16"


def test_unroll_encoder_times_both_variants(tmp_path):
    # Both train steps built, compiled and timed alternately in one process; no timing asserted.
    out = tmp_path / "unroll.json"
    result = unroll_encoder.main(["--model", "tiny", "--rounds", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    for name in unroll_encoder.VARIANTS:
        assert len(result[name]["step_s_all"]) == 2 and result[name]["compile_s"] > 0
    assert result["rolled_over_unrolled"] == result["rolled"]["step_s"] / result["unrolled"]["step_s"]


def test_compile_seconds_before_and_after(tmp_path, repo):
    # benchmarks.compile_seconds on the tiny model: step_profile --compile (nothing run) in a
    # worktree of the before commit (layers unrolled) and in this tree, a process each.
    before = compile_seconds.BEFORE
    if subprocess.run(["git", "cat-file", "-e", f"{before}^{{commit}}"], cwd=repo).returncode:
        pytest.skip(f"commit {before} is not in this clone")
    out = tmp_path / "compile.json"
    results = compile_seconds.main(["--cases", "tiny:packed_tokens:1", "--out", str(out)])
    assert json.loads(out.read_text())["markdown"] == results["markdown"]
    assert results["complete"] and results["environment"]["nproc"] >= 1
    assert results["trees"]["before"]["commit"] == before
    [case] = results["cases"]
    for tree in ("before", "after"):
        record = case[tree]
        assert "error" not in record, record.get("stderr_tail")
        assert record["train_compile_s"] > record["train_lower_s"] > 0
        assert record["eval_compile_s"] > record["eval_lower_s"] > 0
        assert record["persistent_cache"] is False and record["encoder_layers"] == 2
    # Before: a parameter array per layer and the layers' equations unrolled.
    assert case["before"]["parameter_arrays"] > case["after"]["parameter_arrays"]
    assert case["before"]["train_step"] > case["after"]["train_step"]
    assert (f"| {case['before']['train_step']:,} / {case['after']['train_step']:,} | "
            f"{case['before']['train_compile_s']:.1f} / {case['after']['train_compile_s']:.1f} |"
            ) in results["markdown"]
    assert str(out.parent) not in subprocess.run(["git", "worktree", "list"], cwd=repo,
                                                 capture_output=True, text=True).stdout
    assert "compile_seconds_" not in subprocess.run(
        ["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout


def test_compile_seconds_goals_and_planned_table():
    def record(model, layout, layers, train_step, train_s):
        return {"model": model, "layout": layout, "encoder_layers": layers,
                "train_step": train_step, "train_compile_s": train_s, "eval_step": 500,
                "eval_compile_s": 2.0, "dtype": "bfloat16"}

    planned = compile_seconds.planned(
        [compile_seconds.case_spec(*c) for c in cases.COMPILE_CASES], "minilm")
    table = compile_seconds.markdown(planned)
    assert table.count("| not measured yet") == 4 * len(cases.COMPILE_CASES)
    assert "| large_exact | config, 1 | float32 | 24 |" in table
    assert "| large_l2 | packed_tokens, 8 | bfloat16 | 2 |" in table
    results = planned
    for case, (layers, equations, seconds) in zip(
            results["cases"], [(24, 2800, 12.0), (2, 3000, 9.0), (4, 3000, 9.5),
                               (8, 3000, 9.9), (24, 3300, 11.0)]):
        case["after"] = record(case["model"], case["layout"], layers, equations, seconds)
    results["step"] = {"model": "minilm", "iters": 5,
                       "before": {"train": {"step_s": 2.0}, "eval": {"step_s": 0.5}},
                       "after": {"train": {"step_s": 2.2}, "eval": {"step_s": 0.4}}}
    goals = {g["target"]: g for g in compile_seconds.goals(results)}
    assert goals["paper_train_compile_s"]["measured"] == 12.0
    assert goals["paper_train_compile_s"]["met"] is True
    assert goals["train_equations_deep_over_shallow"]["measured"] == pytest.approx(1.1)
    assert goals["step_train_after_over_before"]["missed_by"] == pytest.approx(0.1)
    assert "train 2 s before, 2.2 s after (1.10x)" in compile_seconds.markdown(results)
