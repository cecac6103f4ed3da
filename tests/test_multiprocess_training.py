"""The real tiered model trained by 2 processes × 2 CPU devices joined by jax.distributed.

Three runs of ``multiprocess_workers`` (see there), each through multiprocess_harness (bounded
time, every child killed and reaped on failure or timeout):

1. 2 processes × 2 devices: ``train.train_and_evaluate`` on the tiny config, one short epoch on
   an FSDP mesh over all 4 devices (each process holds half of every large parameter), an async
   checkpoint, the final test reports, then each process restores the latest checkpoint;
2. the same in 1 process × 4 devices (the same global batches and mesh shape);
3. a fresh process with 1 device restores run 1's latest checkpoint for evaluation.

Run 2 does not depend on run 1, so it runs alongside runs 1 and 3: a single process compiles
on one core, which leaves the other core of a 2-core machine free for much of its time.

The parameters come back as each process's own shards and are put together here, so the check
does not rely on the collectives under test.
"""

from __future__ import annotations

import concurrent.futures
import json

import numpy as np
import pytest

# Per run, a guard against a hang only (a loaded machine is slow, not wrong); each child gives
# up waiting for the others a few seconds earlier (the harness).
RUN_TIMEOUT_S = 900
# 1 process × 4 devices against 2 × 2: the same program up to the order of float reductions.
LOSS_RTOL = 1e-5
PARAM_ATOL = 1e-5


def assemble(dumps: list[dict]) -> tuple[dict[str, np.ndarray], dict[str, list[float]]]:
    """Puts the global parameter arrays together from per-process shard dumps.

    Where shards of several processes overlap (replicas), they must be bit-for-bit equal; every
    element must be covered. Returns ({key path: array}, {key path: [share of the array each
    process held]}).
    """
    params, filled, shares = {}, {}, {}
    for process, dump in enumerate(dumps):
        with np.load(dump["file"]) as arrays:
            for leaf in dump["leaves"]:
                name, shape = leaf["path"], tuple(leaf["shape"])
                if name not in params:
                    params[name] = np.zeros(shape, leaf["dtype"])
                    filled[name] = np.zeros(shape, bool)
                    shares[name] = [0.0] * len(dumps)
                held = np.zeros(shape, bool)
                for shard in leaf["shards"]:
                    region = tuple(slice(start, stop) for start, stop in shard["index"])
                    data = arrays[shard["name"]]
                    seen = filled[name][region]
                    np.testing.assert_array_equal(
                        data[seen], params[name][region][seen],
                        err_msg=f"{name}: replicas disagree (process {process}, "
                                f"device {shard['device']})")
                    params[name][region] = data
                    filled[name][region] = True
                    held[region] = True
                shares[name][process] = float(held.mean()) if held.size else 1.0
    missing = [name for name, mask in filled.items() if not mask.all()]
    assert not missing, f"no process holds part of {missing}"
    return params, shares


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest absolute difference between two parameter dicts with the same keys."""
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]), initial=0.0)) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, multiprocess, data_dir, test_xla_flags, main_install):
    """Runs 1-3 of the module docstring: (2-process results, 1-process result, fresh restore
    result, 2-process workdir)."""
    root = tmp_path_factory.mktemp("mp_training")
    folders = {name: root / name for name in ("two", "two_out", "one", "one_out", "fresh_out")}
    for name in ("two_out", "one_out", "fresh_out"):
        folders[name].mkdir()
    env = main_install({"XLA_FLAGS": test_xla_flags})
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        # Run 2 in the background (one process, no coordinator: nothing shared with run 1).
        one_future = pool.submit(
            multiprocess.run_processes, "multiprocess_workers:training_worker", 1,
            devices_per_process=4,
            kwargs=dict(data_dir=data_dir, workdir=str(folders["one"]),
                        out_dir=str(folders["one_out"])),
            env=env, timeout_s=RUN_TIMEOUT_S)
        two = multiprocess.run_processes(
            "multiprocess_workers:training_worker", 2, devices_per_process=2,
            kwargs=dict(data_dir=data_dir, workdir=str(folders["two"]),
                        out_dir=str(folders["two_out"])),
            env=env, timeout_s=RUN_TIMEOUT_S)
        [fresh] = multiprocess.run_processes(
            "multiprocess_workers:restore_worker", 1, devices_per_process=1,
            kwargs=dict(workdir=str(folders["two"]), out_dir=str(folders["fresh_out"])),
            env=env, timeout_s=RUN_TIMEOUT_S)
        [one] = one_future.result()
    return two, one, fresh, folders["two"]


def test_two_processes_train_as_one_run_and_agree(runs):
    two, _, _, workdir = runs
    assert [r["process_index"] for r in two] == [0, 1]
    assert {(r["process_count"], r["device_count"]) for r in two} == {(2, 4)}
    ids = [r["local_device_ids"] for r in two]
    assert [len(i) for i in ids] == [2, 2] and not set(ids[0]) & set(ids[1])
    # A few real steps (the last batch of the epoch padded), every process saw the same losses.
    losses = two[0]["losses"]
    assert len(losses) >= 2 and all(np.isfinite(losses))
    assert two[1]["losses"] == losses
    assert two[0]["final_step"] == two[1]["final_step"] == len(losses)
    np.testing.assert_equal(two[0]["test_metrics"], two[1]["test_metrics"])  # NaN == NaN
    # The parameters each process holds fit together; replicas on both processes are equal.
    _, shares = assemble([r["final_params"] for r in two])
    split = [name for name, s in shares.items() if s == [0.5, 0.5]]
    replicated = [name for name, s in shares.items() if s == [1.0, 1.0]]
    assert split and replicated and len(split) + len(replicated) == len(shares), shares
    # Process 0 alone logged every step once, with the loss the processes computed.
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    logged = [r["loss/total"] for r in records if r["split"] == "train"]
    np.testing.assert_allclose(logged, losses, rtol=1e-7)
    assert (workdir / "reports" / "test.json").is_file()


def test_checkpoint_restores_exactly_in_both_processes(runs):
    two, _, _, _ = runs
    final, _ = assemble([r["final_params"] for r in two])
    restored, _ = assemble([r["restored_params"] for r in two])
    assert [r["restored_step"] for r in two] == [two[0]["final_step"]] * 2
    assert max_abs_diff(restored, final) == 0.0


def test_two_processes_match_one_process_with_four_devices(runs):
    two, one, _, _ = runs
    assert (one["process_count"], one["device_count"]) == (1, 4)
    np.testing.assert_allclose(two[0]["losses"], one["losses"], rtol=LOSS_RTOL)
    final_two, _ = assemble([r["final_params"] for r in two])
    final_one, _ = assemble([one["final_params"]])
    diff = max_abs_diff(final_two, final_one)
    loss_rel = np.max(np.abs(np.subtract(two[0]["losses"], one["losses"])) / np.abs(one["losses"]))
    scale = max(float(np.max(np.abs(v), initial=0.0)) for v in final_one.values())
    print(f"2 processes vs 1: loss max rel diff {loss_rel:.2e}, param max abs diff {diff:.2e} "
          f"(largest |param| {scale:.3g})")
    assert diff < PARAM_ATOL, diff
    for key in ("loss/total", "loss/pre", "loss/eff", "loss/conflict"):
        np.testing.assert_allclose(two[0]["test_metrics"][key], one["test_metrics"][key],
                                   rtol=LOSS_RTOL, err_msg=key)


def test_fresh_single_device_process_restores_the_two_process_checkpoint(runs):
    two, _, fresh, _ = runs
    assert fresh["device_count"] == 1 and fresh["param_devices"] == [0]
    assert fresh["step"] == two[0]["final_step"]
    final, _ = assemble([r["final_params"] for r in two])
    restored, shares = assemble([fresh["params"]])
    assert all(s == [1.0] for s in shares.values())  # whole arrays on the one device
    assert max_abs_diff(restored, final) == 0.0
