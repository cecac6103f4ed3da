"""Every config's train and eval steps compiled by XLA:GPU from this CPU: fit, largest batch, roofline.

``python -m benchmarks.gpu_compile --configs roberta --gpus h100,h200 --search 64 --out FILE``
(CUDA plugin installed): each step at one pair a GPU, then the largest batch that fits; records
added to FILE as made; ``--report FILE``: the table. FLOPs from ``trip_jax.compile.count``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.batch_search import held as held_records, largest, predict  # noqa: F401
from benchmarks.batch_search import mark as mark_in
from benchmarks.tpu_compile import config_of
from trip_jax.compile import run, targets

GIB = 2 ** 30


def measure(name: str, target: str, steps: list[str], overrides: list[str], most: int,
            out: str | None = None) -> list[dict]:
    """Records of ``steps`` of configs/<name>.py on ``target`` (a GPU or node): one pair a GPU,
    and (``most`` > 1) the largest batch up to ``most`` pairs a GPU that fits (``largest``);
    each added to ``out`` as it is made, the largest marked ``largest_that_fits``; a record
    ``out`` already holds is reused, not compiled again."""
    config = config_of(name, overrides)
    held = held_records(out, f"configs/{name}.py", target, overrides)
    accelerator = run.on_devices(targets.target(target))
    start = time.perf_counter()
    trainer = run.build(config, accelerator)
    build_seconds = time.perf_counter() - start
    records = []

    for step in steps:
        def compile_at(per_gpu: int, step=step) -> dict:
            if (step, per_gpu) in held:
                records.append(held[step, per_gpu])
                return held[step, per_gpu]
            record = run.compile_step(trainer, step, per_gpu * accelerator.chips, accelerator)
            record.pop("parameter_placement", None)
            record.update(config=f"configs/{name}.py", overrides=overrides,
                          pairs_per_chip=per_gpu, build_seconds=build_seconds)
            print(run.describe(record), flush=True)
            if out:
                save(out, [record])
            records.append(record)
            return record

        if most > 1:
            best, _ = largest(compile_at, accelerator.chip.hbm_bytes, most)
            mark(out, records, step, best)
        else:
            compile_at(1)
    return records


def mark(out: str | None, records: list[dict], step: str, best: int) -> None:
    """Marks the record of ``step`` at ``best`` pairs a GPU ``largest_that_fits`` (here and in
    ``out``)."""
    mark_in(out, records, step, best, write)


def save(path: str, records: list[dict]) -> None:
    """Adds ``records`` to the JSON file ``path`` (its table rewritten)."""
    file = Path(path)
    old = json.loads(file.read_text())["records"] if file.exists() else []
    write(file, old + records)


def write(file: Path, records: list[dict]) -> None:
    """Writes ``records`` and their table to ``file``."""
    file.write_text(json.dumps({"compile_time_figures": True, "compiler": "XLA:GPU",
                                "records": records, "markdown": table(records)}, indent=1)
                    + "\n")


def table(records: list[dict]) -> str:
    """The markdown table of the records (compile-time figures; FLOPs counted)."""
    lines = ["| config | overrides | GPUs | step | pairs/GPU | compile s | GiB/GPU (of memory) | "
             "fits | FLOPs/GPU (counted) | FLOPs/byte (ridge, peak) | collectives GiB/GPU | "
             "roofline ms (lower bound) | pairs/s/GPU (bound) |",
             "|" + "---|" * 13]
    for r in sorted(records, key=lambda r: (r["config"], r["accelerator"], r["overrides"],
                                            r["step"] != "train", r["pairs_per_chip"])):
        mem, cost, roof = r["memory_bytes"], r.get("cost"), r.get("roofline")
        moved = sum(v["bytes"] for v in r.get("collectives", {}).values())
        largest_mark = " (largest)" if r.get("largest_that_fits") else ""
        lines.append(
            f"| `{r['config']}` | {' '.join(r['overrides']) or '-'} | {r['accelerator']} | "
            f"{r['step']} | {r['pairs_per_chip']}{largest_mark} | {r['compile_seconds']:.0f} | "
            f"{(mem['total'] or 0) / GIB:.2f}{'+' if mem.get('at_least') else ''} "
            f"({r['hbm_bytes'] / GIB:.1f}) | {'yes' if r['fits'] else 'no'} | "
            + (f"{cost['flops']:.3g} | {roof['intensity_flops_per_byte']:.0f} "
               f"({roof['ridge_point']:.0f}, {r['peak']['name']}) | {moved / GIB:.2f} | "
               f"{roof['step_seconds'] * 1e3:.1f} | {roof['pairs_per_second_per_chip']:.1f} |"
               if cost else "- | - | - | - | - |"))
    return "\n".join(lines)


def main(argv=None) -> None:
    """The command (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="roberta")
    parser.add_argument("--gpus", default="h100")
    parser.add_argument("--steps", default="train,eval")
    parser.add_argument("--search", type=int, default=0, help="most pairs a GPU to try")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE config override")
    parser.add_argument("--out", help="JSON file the records are added to")
    parser.add_argument("--report", help="print the table of this JSON file and stop")
    args = parser.parse_args(argv)
    if args.report:
        print(table(json.loads(Path(args.report).read_text())["records"]))
        return
    records = []
    for name in args.configs.split(","):
        for gpu in args.gpus.split(","):
            records += measure(name, gpu, args.steps.split(","), args.set, args.search,
                               out=args.out)
    print(table(records))


if __name__ == "__main__":
    main(sys.argv[1:])
