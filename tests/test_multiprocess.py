"""Real multi-process JAX on this machine: 2 processes × 2 CPU devices joined by jax.distributed.

The functions named ``*_worker`` run inside the child processes (conftest's ``multiprocess``:
tests/multiprocess_harness.py).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest


LEARNING_RATE = 0.1


def _toy_data():
    """A fixed regression problem: 8 rows (2 per device of a 4-device mesh), 3 features."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    return x, y


def _sgd_step(params, x, y):
    import jax
    import jax.numpy as jnp

    def loss_fn(p):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss


def _zero_params():
    return {"w": np.zeros(3, np.float32), "b": np.zeros((), np.float32)}


def sgd_worker(steps: int) -> dict:
    """In each process: a few SGD steps of a linear model over the global 4-device mesh."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    x, y = _toy_data()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    # Each process feeds only its own rows of the global batch.
    per_process = len(x) // jax.process_count()
    mine = slice(jax.process_index() * per_process, (jax.process_index() + 1) * per_process)
    gx = jax.make_array_from_process_local_data(rows, x[mine], x.shape)
    gy = jax.make_array_from_process_local_data(rows, y[mine], y.shape)
    params = jax.device_put(_zero_params(), replicated)
    step = jax.jit(_sgd_step, out_shardings=(replicated, replicated))
    losses = []
    for _ in range(steps):
        params, loss = step(params, gx, gy)
        losses.append(float(loss))
    total = jax.jit(lambda a: a.sum(), out_shardings=replicated)(gx)
    return {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "local_rows": sorted({int(i) for shard in gx.addressable_shards
                              for i in range(len(x))[shard.index[0]]}),
        "sum": float(total),
        "losses": losses,
        "w": np.asarray(params["w"]).tolist(),
        "b": float(params["b"]),
    }


def stuck_or_failing_worker(fail_process: int) -> dict:
    """Process ``fail_process`` raises; the others hang (to exercise the harness)."""
    import jax

    if jax.process_index() == fail_process:
        raise ValueError("deliberate failure in a child")
    time.sleep(600)
    return {}


def _assert_all_gone(pids) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_two_processes_agree_with_single_process(multiprocess):
    steps = 3
    results = multiprocess.run_processes("test_multiprocess:sgd_worker", 2,
                                         kwargs={"steps": steps}, devices_per_process=2,
                                         timeout_s=600)

    # The same steps in this single process, no sharding.
    x, y = _toy_data()
    params, losses = _zero_params(), []
    for _ in range(steps):
        params, loss = _sgd_step(params, x, y)
        losses.append(float(loss))

    assert [r["process_index"] for r in results] == [0, 1]
    assert {(r["process_count"], r["device_count"], r["local_device_count"])
            for r in results} == {(2, 4, 2)}
    # Each process holds only its half of the rows.
    assert [r["local_rows"] for r in results] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for r in results:
        np.testing.assert_allclose(r["sum"], x.sum(), rtol=1e-5)
        np.testing.assert_allclose(r["losses"], losses, rtol=1e-5)
        np.testing.assert_allclose(r["w"], np.asarray(params["w"]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r["b"], float(params["b"]), rtol=1e-5, atol=1e-6)
    assert results[0]["w"] == results[1]["w"] and results[0]["losses"] == results[1]["losses"]
    assert losses[-1] < losses[0]  # the steps did train


def test_timeout_kills_processes_and_says_so(multiprocess):
    with pytest.raises(multiprocess.MultiprocessTimeout, match="timed out after 3 s") as info:
        multiprocess.run_processes("test_multiprocess:stuck_or_failing_worker", 2,
                                   kwargs={"fail_process": -1}, timeout_s=3)
    assert "--- process 1" in str(info.value)
    assert len(info.value.pids) == 2
    _assert_all_gone(info.value.pids)


def test_a_failing_process_stops_the_others_with_its_traceback(multiprocess):
    # The timeout only guards against a hang: the failure, not the clock, ends the run.
    with pytest.raises(multiprocess.MultiprocessError,
                       match="deliberate failure in a child") as info:
        multiprocess.run_processes("test_multiprocess:stuck_or_failing_worker", 2,
                                   kwargs={"fail_process": 1}, timeout_s=600)
    assert not isinstance(info.value, multiprocess.MultiprocessTimeout)  # did not wait for it
    _assert_all_gone(info.value.pids)
