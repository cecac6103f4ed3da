"""Every config's train and eval steps compiled by XLA:GPU from this CPU: fit, largest batch, roofline.

``python -m benchmarks.gpu_compile --configs roberta --gpus h100,h200 --search 64 --out FILE``
(CUDA plugin installed): each step at one pair a GPU, then the largest batch that fits; records
added to FILE as made; ``--report FILE``: the table. FLOPs from ``trip_jax.compile.count``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks import batch_search
from benchmarks.batch_search import largest, predict  # noqa: F401

GIB = 2 ** 30


def measure(name: str, target: str, steps: list[str], overrides: list[str], most: int,
            out: str | None = None) -> list[dict]:
    """Records of ``steps`` of configs/<name>.py on ``target`` (a GPU or node):
    ``batch_search.measure``."""
    return batch_search.measure(name, target, steps, overrides, most, out, write)


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
        cost, roof = r.get("cost"), r.get("roofline")
        moved = sum(v["bytes"] for v in r.get("collectives", {}).values())
        lines.append(
            batch_search.leading_cells(r, hbm_digits=1)
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
