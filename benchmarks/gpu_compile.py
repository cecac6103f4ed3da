"""Every config's train and eval steps compiled by XLA:GPU from this CPU: fit, largest batch, roofline.

``python -m benchmarks.gpu_compile --configs roberta --gpus h100,h200 --search 64 --out FILE``
(CUDA plugin installed): each step at one pair a GPU, then the largest batch that fits; records
added to FILE as made; ``--report FILE``: the table. FLOPs from ``trip_jax.compile.count``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks import batch_search
from benchmarks.batch_search import largest, predict  # noqa: F401

GIB = 2 ** 30


def measure(name: str, target: str, steps: list[str], overrides: list[str], most: int,
            per_chip_list: list[int] | None = None, out: str | None = None) -> list[dict]:
    """Records of ``steps`` of configs/<name>.py on ``target`` (a GPU or node):
    ``batch_search.measure``."""
    return batch_search.measure(name, target, steps, overrides, most, out, write, per_chip_list)


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
    """The command (module docstring; ``batch_search.command``)."""
    batch_search.command(argv, __doc__, measure, table, "gpus", "h100")


if __name__ == "__main__":
    main(sys.argv[1:])
