"""A config's steps compiled at one pair a chip, or at the largest batch that fits, found with few
compiles, records kept in a JSON file: shared by benchmarks/tpu_compile.py and
benchmarks/gpu_compile.py (compile-time figures)."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import time
from pathlib import Path

import ml_collections

from configs import base
from trip_jax.compile import run, targets
from trip_jax.config.typed import typed

GIB = 2 ** 30


def config_of(name: str, overrides: list[str]):
    """The typed config of configs/<name>.py with ``overrides`` ("section.key=value") set."""
    config = importlib.import_module(f"configs.{name}").get_config()
    for item in overrides:
        key, _, text = item.partition("=")
        current = base.get_key(config, key)
        value = (text.lower() in ("1", "true", "yes") if isinstance(current, bool)
                 else type(current)(text))
        base.set_keys(config, {key: value})
    return typed(ml_collections.ConfigDict(config))


def measure(name: str, target: str, steps: list[str], overrides: list[str], most: int,
            out: str | None, write, per_chip_list: list[int] | None = None, annotate=None
            ) -> list[dict]:
    """Records of ``steps`` of configs/<name>.py compiled for ``target`` (a TPU type, a GPU or a
    node): at each of ``per_chip_list`` pairs a chip, else at one pair and (``most`` > 1) the
    largest batch up to ``most`` that fits (``largest``), marked ``largest_that_fits``.
    ``annotate(config, record, accelerator)`` adds figures to each new record; each is printed
    and added to ``out`` (``write(file, records)``) as made; a record ``out`` holds is reused."""
    config = config_of(name, overrides)
    on_file = held(out, f"configs/{name}.py", target, overrides)
    accelerator = run.on_devices(targets.target(target))
    start = time.perf_counter()
    trainer = run.build(config, accelerator)
    build_seconds = time.perf_counter() - start
    records = []
    for step in steps:
        def compile_at(per_chip: int, step=step) -> dict:
            if (step, per_chip) in on_file:
                records.append(on_file[step, per_chip])
                return on_file[step, per_chip]
            record = run.compile_step(trainer, step, per_chip * accelerator.chips, accelerator)
            record.pop("parameter_placement", None)
            record.update(config=f"configs/{name}.py", overrides=overrides,
                          pairs_per_chip=per_chip, build_seconds=build_seconds)
            if annotate:
                annotate(config, record, accelerator)
            records.append(record)
            print(run.describe(record), flush=True)
            if out:
                save(out, [record], write)
            return record

        if per_chip_list:
            for per_chip in per_chip_list:
                compile_at(per_chip)
        elif most > 1:
            best, _ = largest(compile_at, accelerator.chip.hbm_bytes, most)
            mark(out, [r for r in records if r["step"] == step], step, best, write)
        else:
            compile_at(1)
    return records


def command(argv, doc: str, measure, table, targets_flag: str, default: str) -> None:
    """Both scripts' command line: ``--configs`` and ``--TARGETS_FLAG`` (comma lists), ``--steps``,
    ``--search``, ``--pairs-per-chip``, ``--set``, ``--out``: every record
    ``measure(config, target, steps, overrides, search, pairs_per_chip, out)`` made, then their
    table; ``--report FILE``: FILE's table only."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--configs", default="roberta")
    parser.add_argument(f"--{targets_flag}", dest="targets", metavar=targets_flag.upper(),
                        default=default)
    parser.add_argument("--steps", default="train,eval")
    parser.add_argument("--search", type=int, default=0, help="most pairs a chip to try")
    parser.add_argument("--pairs-per-chip", help="these pairs a chip (1,8,...), not a search")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE config override")
    parser.add_argument("--out", help="JSON file the records are added to")
    parser.add_argument("--report", help="print the table of this JSON file and stop")
    args = parser.parse_args(argv)
    if args.report:
        print(table(json.loads(Path(args.report).read_text())["records"]))
        return
    per_chip = [int(n) for n in (args.pairs_per_chip or "").split(",") if n]
    records = []
    for name in args.configs.split(","):
        for target in args.targets.split(","):
            records += measure(name, target, args.steps.split(","), args.set, args.search,
                               per_chip, out=args.out)
    print(table(records))


def leading_cells(record: dict, hbm_digits: int) -> str:
    """A table row's first seven cells, both scripts': config, overrides, accelerator, step, pairs
    a chip (largest marked), compile s, GiB a chip (of HBM, ``hbm_digits`` decimals), fits."""
    r, mem = record, record["memory_bytes"]
    largest_mark = " (largest)" if r.get("largest_that_fits") else ""
    return (f"| `{r['config']}` | {' '.join(r['overrides']) or '-'} | {r['accelerator']} | "
            f"{r['step']} | {r['pairs_per_chip']}{largest_mark} | {r['compile_seconds']:.0f} | "
            f"{(mem['total'] or 0) / GIB:.2f}{'+' if mem.get('at_least') else ''} "
            f"({r['hbm_bytes'] / GIB:.{hbm_digits}f}) | {'yes' if r['fits'] else 'no'} | ")


def save(path: str, records: list[dict], write) -> None:
    """Adds ``records`` to the JSON file ``path`` (``write(file, records)`` rewrites it)."""
    file = Path(path)
    old = json.loads(file.read_text())["records"] if file.exists() else []
    write(file, old + records)


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
