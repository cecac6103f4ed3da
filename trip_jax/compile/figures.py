"""What a compiled step costs a chip, read off the compiler: memory, FLOPs, collectives, roofline.

``step_figures(compiled, chip, pairs, chips)`` -> one dict of compile-time figures (per chip:
the program XLA compiled runs once on every chip). Nothing here ran on a TPU. Details:
docs/compile.md#figures.
"""

from __future__ import annotations

import re
from typing import Any

from trip_jax.compile.chips import Chip

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
# Bytes of each element type of an HLO shape.
ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                 "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
# "%name = SHAPE op(" or "%name = SHAPE op-start(" (asynchronous collectives).
_CONDITION = re.compile(r"\bwhile\(.*?condition=%?([\w.\-]+)")
_INT_CONSTANT = re.compile(r"= s32\[\]\S* constant\((\d+)\)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_INSTRUCTION = re.compile(r"=\s*(\(.*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")


def shape_bytes(text: str) -> list[int]:
    """Bytes of each array shape in an HLO shape ``text`` ("f32[8,16]{1,0}", or a tuple)."""
    out = []
    for element, dims in _SHAPE.findall(text):
        if element in ELEMENT_BYTES:
            size = 1
            for d in filter(None, dims.split(",")):
                size *= int(d)
            out.append(size * ELEMENT_BYTES[element])
    return out


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """{collective: {"count", "bytes"}} of a compiled module's text: each instruction once (an
    asynchronous one at its start), its bytes those of its result (of an async start's tuple:
    the last array, the result)."""
    out = {name: {"count": 0, "bytes": 0} for name in COLLECTIVES}
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.search(line)
        if not match:
            continue
        sizes = shape_bytes(match.group(1))
        out[match.group(2)]["count"] += 1
        out[match.group(2)]["bytes"] += (sizes[-1] if match.group(3) and sizes else sum(sizes))
    return out


def loop_trip_counts(hlo_text: str) -> list[int]:
    """Trip counts above 1 of the module's while loops (a scanned encoder's layers), read off
    each loop's condition (``i < N``: its integer constant) or XLA's ``known_trip_count``: XLA's
    cost analysis counts a loop's body once, so its FLOPs and bytes are then lower bounds."""
    counts = [int(n) for n in _TRIP_COUNT.findall(hlo_text)]
    for condition in _CONDITION.findall(hlo_text):
        block = re.search(rf"^%?{re.escape(condition)} \(.*?^}}", hlo_text, re.M | re.S)
        found = _INT_CONSTANT.findall(block.group(0)) if block else []
        if found:
            counts.append(max(int(n) for n in found))
    return sorted(n for n in counts if n > 1)


def memory(compiled) -> dict[str, int]:
    """Bytes per chip (``compiled.memory_analysis()``): arguments, outputs, aliased (outputs
    written over donated arguments), temporaries, generated code and their total."""
    m = compiled.memory_analysis()
    out = {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
           "aliased": m.alias_size_in_bytes, "temporaries": m.temp_size_in_bytes,
           "generated_code": m.generated_code_size_in_bytes}
    out["total"] = (out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
                    + out["generated_code"])
    return out


def cost(compiled) -> dict[str, float] | None:
    """FLOPs and bytes accessed per chip (``compiled.cost_analysis()``), None where the
    compiler gives none."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    if not analysis or "flops" not in analysis:
        return None
    return {"flops": float(analysis["flops"]),
            "bytes_accessed": float(analysis.get("bytes accessed", 0.0))}


def roofline(flops: float, bytes_accessed: float, chip: Chip, pairs: int, chips: int
             ) -> dict[str, Any]:
    """The roofline bound of a step of ``pairs`` pairs over ``chips`` chips, each running
    ``flops`` and ``bytes_accessed``: time = max(FLOPs / peak, bytes / bandwidth); its
    arithmetic intensity against the chip's ridge point; the pairs/s it bounds (slice, chip)."""
    compute, memory_time = flops / chip.peak_flops, bytes_accessed / chip.hbm_bandwidth
    seconds = max(compute, memory_time)
    intensity = flops / bytes_accessed if bytes_accessed else float("inf")
    return {"intensity_flops_per_byte": intensity, "ridge_point": chip.ridge_point,
            "intensity_over_ridge": intensity / chip.ridge_point,
            "bound": "compute" if compute >= memory_time else "memory",
            "step_seconds": seconds,
            "pairs_per_second": pairs / seconds if seconds else float("inf"),
            "pairs_per_second_per_chip": pairs / seconds / chips if seconds else float("inf")}


def counted_cost(flops: float, memory_bytes: dict[str, int], chip, pairs: int, chips: int
                 ) -> dict[str, Any]:
    """``cost`` and ``roofline`` where the compiler gives no cost analysis (XLA:GPU): ``flops``
    counted from the model's sizes (a device's share), bytes accessed at least the arguments read
    and the outputs written once (``memory_bytes``); so the roofline time is a lower bound too."""
    moved = memory_bytes["arguments"] + memory_bytes["outputs"]
    return {"cost": {"flops": flops, "bytes_accessed": float(moved), "counted": True},
            "roofline": roofline(flops, moved, chip, pairs, chips)}


def step_figures(compiled, chip: Chip, pairs: int, chips: int) -> dict[str, Any]:
    """Every compile-time figure of one compiled step (module docstring)."""
    mem, text = memory(compiled), compiled.as_text()
    out: dict[str, Any] = {"memory_bytes": mem, "hbm_bytes": chip.hbm_bytes,
                           "fits": mem["total"] <= chip.hbm_bytes,
                           "collectives": collectives(text),
                           "loop_trip_counts": loop_trip_counts(text)}
    analysis = cost(compiled)
    out["cost"] = analysis
    if analysis:
        out["roofline"] = roofline(analysis["flops"], analysis["bytes_accessed"], chip, pairs,
                                   chips)
    return out
