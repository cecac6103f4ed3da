"""Every config's train and eval steps compiled by XLA:TPU from this CPU: fit, batch, roofline.

``python -m benchmarks.tpu_compile --configs roberta --accelerators v5e-8 --out FILE``: one pair
a chip (``--search 64``: then the largest batch that fits, benchmarks/batch_search.py), records
added to FILE with benchmarks/flops.py's count beside the compiler's; ``--report FILE``: the table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks import batch_search
from trip_jax.compile import count, encoders

GIB = 2 ** 30


def counted_flops(config, record: dict) -> float:
    """benchmarks/flops.py's count (``trip_jax.compile.count.step_flops``) of the compiled step
    over the whole slice."""
    return count.step_flops(config, encoders.encoder_config(config), record["step"],
                            record["batch_sizes"])


def flops_py_figures(config, record: dict, accelerator) -> None:
    """Adds benchmarks/flops.py's count beside the compiler's to ``record``: the ratio, and the
    step's time and pairs/s bound from the counted FLOPs (the compiler counts a scanned
    encoder's layer once)."""
    if not record.get("cost") or record["cost"].get("counted"):
        return
    counted = counted_flops(config, record)
    record["flops_py_slice"] = counted
    record["compiler_over_flops_py"] = record["cost"]["flops"] * accelerator.chips / counted
    floor = counted / accelerator.chips / accelerator.chip.peak_flops
    seconds = max(floor, record["roofline"]["step_seconds"])
    record["roofline_flops_py"] = {"step_seconds": seconds,
                                   "pairs_per_second_per_chip": record["pairs_per_chip"] / seconds}


def measure(name: str, accelerator_name: str, steps: list[str], overrides: list[str],
            search: int, per_chip_list: list[int] | None = None, out: str | None = None
            ) -> list[dict]:
    """Records of ``steps`` of configs/<name>.py on ``accelerator_name``
    (``batch_search.measure``), with benchmarks/flops.py's count beside the compiler's."""
    return batch_search.measure(name, accelerator_name, steps, overrides, search, out, write,
                                per_chip_list, annotate=flops_py_figures)


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
        cost, roof = r.get("cost"), r.get("roofline")
        moved = sum(v["bytes"] for v in r.get("collectives", {}).values())
        lines.append(
            batch_search.leading_cells(r, hbm_digits=0)
            + (f"{cost['flops']:.3g} | {roof['intensity_flops_per_byte']:.0f} "
               f"({roof['ridge_point']:.0f}) | {moved / GIB:.2f} | "
               f"{roof['step_seconds'] * 1e3:.1f} | {roof['pairs_per_second_per_chip']:.1f} | "
               f"{r['compiler_over_flops_py']:.2f} | "
               f"{r['roofline_flops_py']['step_seconds'] * 1e3:.1f}, "
               f"{r['roofline_flops_py']['pairs_per_second_per_chip']:.1f} |"
               if cost else "- | - | - | - | - | - | - |"))
    return "\n".join(lines)


def main(argv=None) -> None:
    """The command (module docstring; ``batch_search.command``)."""
    batch_search.command(argv, __doc__, measure, table, "accelerators", "v5e-8")


if __name__ == "__main__":
    main(sys.argv[1:])
