"""The largest batch that fits a chip, found with few compiles: shared by
benchmarks/tpu_compile.py and benchmarks/gpu_compile.py (compile-time figures)."""

from __future__ import annotations

import json
import math
from pathlib import Path


def predict(points: dict[int, int], hbm: int, most: int) -> int:
    """The largest pairs a chip (1..``most``) whose memory fits ``hbm`` bytes on the line through
    the two largest-batch ``points`` ({pairs a chip: total bytes}) below and above it."""
    (b0, m0), (b1, m1) = sorted(points.items())[:1] + sorted(points.items())[-1:]
    slope = (m1 - m0) / (b1 - b0)
    if slope <= 0:
        return most
    return max(1, min(most, math.floor(b0 + (hbm - m0) / slope)))


def largest(compile_at, hbm: int, most: int) -> tuple[int, list[dict]]:
    """The largest pairs a chip up to ``most`` at which ``compile_at(pairs)`` (a record) fits
    ``hbm``, and the records compiled to find it: at 1 and ``most``; else at the pairs the
    straight line through the nearest fitting and non-fitting batches predicts, until two
    neighbours straddle the limit (memory grows about linearly with the batch)."""
    records = {1: compile_at(1)}
    if not records[1]["fits"]:
        return 0, list(records.values())
    records[most] = compile_at(most)
    while True:
        fits = max(b for b, r in records.items() if r["fits"])
        over = min((b for b, r in records.items() if not r["fits"]), default=None)
        if over is None or over == fits + 1:
            return fits, list(records.values())
        line = {fits: records[fits]["memory_bytes"]["total"],
                over: records[over]["memory_bytes"]["total"]}
        guess = min(max(predict(line, hbm, most), fits + 1), over - 1)
        if guess in records:  # the line points at a batch already compiled: step past it
            guess = fits + 1 if records[guess]["fits"] else over - 1
        records[guess] = compile_at(guess)


def same_run(record: dict, config: str, accelerator: str, overrides: list[str]) -> bool:
    """Whether ``record`` is of ``config`` on ``accelerator`` with ``overrides``."""
    return (record["config"] == config and record["accelerator"] == accelerator
            and record["overrides"] == overrides)


def held(out: str | None, config: str, accelerator: str, overrides: list[str]
         ) -> dict[tuple[str, int], dict]:
    """The records the JSON file ``out`` already holds of ``config`` on ``accelerator`` with
    ``overrides``, by (step, pairs a chip): reused, not compiled again."""
    if not out or not Path(out).exists():
        return {}
    return {(r["step"], r["pairs_per_chip"]): r
            for r in json.loads(Path(out).read_text())["records"]
            if same_run(r, config, accelerator, overrides)}


def mark(out: str | None, records: list[dict], step: str, best: int, write) -> None:
    """Marks the record of ``step`` at ``best`` pairs a chip ``largest_that_fits`` (here and in
    ``out``, rewritten by ``write(file, records)``)."""
    for record in records:
        if record["step"] == step and record["pairs_per_chip"] == best:
            record["largest_that_fits"] = True
    if out and records:
        file = Path(out)
        data = json.loads(file.read_text())
        first = records[0]
        for record in data["records"]:
            if (record["step"] == step and record["pairs_per_chip"] == best
                    and same_run(record, first["config"], first["accelerator"],
                                 first["overrides"])):
                record["largest_that_fits"] = True
        write(file, data["records"])
