"""Every config's train and eval steps compiled by XLA:TPU from this CPU: fit, batch, roofline.

``python -m benchmarks.tpu_compile --configs roberta --accelerators v5e-8 --out FILE``: one pair
a chip (``--search 64``: then the largest batch that fits, benchmarks/batch_search.py), records
added to FILE with benchmarks/flops.py's count beside the compiler's; ``--report FILE``: the table."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import ml_collections

from benchmarks import batch_search
from configs import base
from trip_jax.compile import count, encoders, run, targets
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


def counted_flops(config, record: dict) -> float:
    """benchmarks/flops.py's count (``trip_jax.compile.count.step_flops``) of the compiled step
    over the whole slice."""
    return count.step_flops(config, encoders.encoder_config(config), record["step"],
                            record["batch_sizes"])


def measure(name: str, accelerator_name: str, steps: list[str], overrides: list[str],
            search: int, per_chip_list: list[int] | None = None, out: str | None = None
            ) -> list[dict]:
    """Records of ``steps`` of configs/<name>.py on ``accelerator_name`` at one pair a chip, then
    (``search`` > 1) the largest batch up to ``search`` pairs a chip that fits, found with few
    compiles (benchmarks/batch_search.py, shared with benchmarks/gpu_compile.py) and marked
    ``largest_that_fits``; or at each of ``per_chip_list`` pairs a chip. Each record is added
    to the JSON file ``out`` (``save``) as soon as it is made; a record ``out`` already holds
    is reused, not compiled again."""
    config = config_of(name, overrides)
    held = batch_search.held(out, f"configs/{name}.py", accelerator_name, overrides)
    accelerator = run.on_devices(targets.target(accelerator_name))
    start = time.perf_counter()
    trainer = run.build(config, accelerator)
    build_seconds = time.perf_counter() - start
    records = []
    for step in steps:
        def compile_at(per_chip: int, step=step) -> dict:
            if (step, per_chip) in held:
                records.append(held[step, per_chip])
                return held[step, per_chip]
            record = run.compile_step(trainer, step, per_chip * accelerator.chips, accelerator)
            record.pop("parameter_placement", None)
            record.update(config=f"configs/{name}.py", overrides=overrides,
                          pairs_per_chip=per_chip, build_seconds=build_seconds)
            if record.get("cost") and not record["cost"].get("counted"):
                counted = counted_flops(config, record)
                record["flops_py_slice"] = counted
                record["compiler_over_flops_py"] = (record["cost"]["flops"] * accelerator.chips
                                                    / counted)
                # The compute floor from the counted FLOPs (the compiler counts a scanned
                # encoder's layer once): the step's time and pairs/s bound.
                floor = counted / accelerator.chips / accelerator.chip.peak_flops
                seconds = max(floor, record["roofline"]["step_seconds"])
                record["roofline_flops_py"] = {
                    "step_seconds": seconds,
                    "pairs_per_second_per_chip": per_chip / seconds}
            records.append(record)
            print(run.describe(record), flush=True)
            if out:
                save(out, [record])
            return record

        if per_chip_list:
            for per_chip in per_chip_list:
                compile_at(per_chip)
        elif search > 1:
            best, _ = batch_search.largest(compile_at, accelerator.chip.hbm_bytes, search)
            batch_search.mark(out, [r for r in records if r["step"] == step], step, best,
                              write)
        else:
            compile_at(1)
    return records


def save(path: str, records: list[dict]) -> None:
    """Adds ``records`` to the JSON file ``path`` (its table rewritten)."""
    file = Path(path)
    old = json.loads(file.read_text())["records"] if file.exists() else []
    write(file, old + records)


def write(file: Path, records: list[dict]) -> None:
    """Writes ``records`` and their table to ``file``."""
    file.write_text(json.dumps({"compile_time_figures": True, "records": records,
                                "markdown": table(records)}, indent=1) + "\n")


def table(records: list[dict]) -> str:
    """The markdown table of the records (compile-time figures)."""
    lines = ["| config | overrides | type | step | pairs/chip | compile s | GiB/chip (of HBM) | "
             "fits | FLOPs/chip | FLOPs/byte (ridge) | collectives GiB/chip | roofline ms | "
             "pairs/s/chip | compiler/flops.py | roofline ms, pairs/s/chip (flops.py) |",
             "|" + "---|" * 15]
    for r in records:
        mem = r["memory_bytes"]
        cost, roof = r.get("cost"), r.get("roofline")
        moved = sum(v["bytes"] for v in r.get("collectives", {}).values())
        largest_mark = " (largest)" if r.get("largest_that_fits") else ""
        lines.append(
            f"| `{r['config']}` | {' '.join(r['overrides']) or '-'} | {r['accelerator']} | "
            f"{r['step']} | {r['pairs_per_chip']}{largest_mark} | {r['compile_seconds']:.0f} | "
            f"{(mem['total'] or 0) / GIB:.2f}{'+' if mem.get('at_least') else ''} "
            f"({r['hbm_bytes'] / GIB:.0f}) | {'yes' if r['fits'] else 'no'} | "
            + (f"{cost['flops']:.3g} | {roof['intensity_flops_per_byte']:.0f} "
               f"({roof['ridge_point']:.0f}) | {moved / GIB:.2f} | "
               f"{roof['step_seconds'] * 1e3:.1f} | {roof['pairs_per_second_per_chip']:.1f} | "
               f"{r['compiler_over_flops_py']:.2f} | "
               f"{r['roofline_flops_py']['step_seconds'] * 1e3:.1f}, "
               f"{r['roofline_flops_py']['pairs_per_second_per_chip']:.1f} |"
               if cost else "- | - | - | - | - | - | - |"))
    return "\n".join(lines)


def main(argv=None) -> None:
    """The command (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="roberta")
    parser.add_argument("--accelerators", default="v5e-8")
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
    records = []
    for name in args.configs.split(","):
        for acc in args.accelerators.split(","):
            records += measure(name, acc, args.steps.split(","), args.set, args.search,
                               [int(n) for n in (args.pairs_per_chip or "").split(",") if n],
                               out=args.out)
    print(table(records))


if __name__ == "__main__":
    main(sys.argv[1:])
