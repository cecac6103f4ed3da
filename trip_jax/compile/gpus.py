"""NVIDIA GPUs and nodes for XLA:GPU's compile-only topology: public figures, target config.

``node("2xh100x8")`` -> ``chips.Accelerator`` (platform "cuda", topology hosts x 1 x GPUs);
``target_config(gpu)`` -> the ``GpuTargetConfigProto`` text; ``at_precision(gpu, dtype,
precision)``: the GPU at its matmul peak. Sources beside each figure; docs/compile.md#gpus."""

from __future__ import annotations

import dataclasses
import re

from trip_jax.compile.chips import Accelerator

KIB = 2 ** 10
MIB = 2 ** 20
GB = 10 ** 9

# CUDA C++ Programming Guide, "Compute Capabilities", table "Technical Specifications per
# Compute Capability" (https://docs.nvidia.com/cuda/cuda-c-programming-guide/
# #features-and-technical-specifications): the same for 8.0 and 9.0 unless named.
THREADS_PER_BLOCK = 1024
THREADS_PER_WARP = 32
THREADS_PER_SM = 2048
REGISTERS_PER_SM = 64 * KIB          # 32-bit registers
REGISTERS_PER_BLOCK = 64 * KIB
SHARED_MEMORY_PER_BLOCK = 48 * KIB   # without opting in
GRID_DIM_LIMIT = (2 ** 31 - 1, 65535, 65535)


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU's public figures: dense matmul peaks (bf16, tf32, fp32 FLOP/s), memory
    bytes and bytes/s, and what XLA:GPU's target config holds (SMs, clock, caches, limits)."""

    name: str                 # "h100"
    device_kind: str          # the name CUDA reports, which the compile-only devices take
    peak_flops: float         # bf16 dense tensor-core peak, FLOP/s (the one the roofline uses)
    peak_tf32: float          # tf32 dense tensor-core peak
    peak_fp32: float          # fp32 without tensor cores
    hbm_bytes: int            # the datasheet's GB, 10^9 bytes
    hbm_bandwidth: float      # bytes/s
    sms: int
    fp32_lanes_per_sm: int
    clock_ghz: float          # boost clock: fp32 peak = sms x lanes x 2 x clock
    l2_bytes: int
    compute_capability: tuple[int, int]
    shared_memory_per_sm: int
    shared_memory_per_block_optin: int
    source: str
    peak_name: str = "bf16"   # which peak ``peak_flops`` is (``at_precision``)

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte above which a step is compute-bound on this GPU."""
        return self.peak_flops / self.hbm_bandwidth


GPUS: dict[str, Gpu] = {g.name: g for g in (
    # NVIDIA H100 datasheet (H100 SXM: BF16 1,979 TFLOPS with sparsity, 989.5 dense; TF32 989
    # sparse, 494.5 dense; FP32 67 TFLOPS; 80 GB HBM3 at 3.35 TB/s); Hopper architecture
    # whitepaper (H100 SXM5: 132 SMs, 128 FP32 cores an SM, 50 MB L2; shared memory up to 228 KB
    # an SM, 227 KB a block); compute capability 9.0. Clock 1.98 GHz = 67e12 / (132 x 128 x 2).
    Gpu("h100", "NVIDIA H100 80GB HBM3", 989.5e12, 494.5e12, 67e12, 80 * GB, 3.35e12, 132, 128,
        1.98, 50 * MIB, (9, 0), 228 * KIB, 227 * KIB,
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet; "
        "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"),
    # NVIDIA H200 datasheet (H200 SXM: the H100's compute, BF16 1,979 TFLOPS sparse, TF32 989
    # sparse, FP32 67 TFLOPS; 141 GB HBM3e at 4.8 TB/s); the same GH100 chip as H100 SXM.
    Gpu("h200", "NVIDIA H200", 989.5e12, 494.5e12, 67e12, 141 * GB, 4.8e12, 132, 128, 1.98,
        50 * MIB, (9, 0), 228 * KIB, 227 * KIB,
        "https://www.nvidia.com/en-us/data-center/h200/; Hopper architecture whitepaper"),
    # NVIDIA A100 datasheet (A100 80GB SXM: BF16 312 TFLOPS dense, TF32 156, FP32 19.5; 80 GB
    # HBM2e at 2,039 GB/s); Ampere GA100 whitepaper (108 SMs, 64 FP32 cores an SM, 40 MB L2,
    # shared memory up to 164 KB an SM, 163 KB a block); compute capability 8.0.
    # Clock 1.41 GHz = 19.5e12 / (108 x 64 x 2).
    Gpu("a100", "NVIDIA A100-SXM4-80GB", 312e12, 156e12, 19.5e12, 80 * GB, 2.039e12, 108, 64,
        1.41, 40 * MIB, (8, 0), 164 * KIB, 163 * KIB,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; "
        "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/"
        "nvidia-ampere-architecture-whitepaper.pdf"),
)}

_NODE = re.compile(r"(?:(\d+)x)?([a-z]\d+)(?:x(\d+))?")


def is_gpu_name(name: str) -> bool:
    """Whether ``name`` is spelt as a GPU or node (``h100``, ``h100x8``, ``2xh100x8``), known or
    not; Cloud TPU's names (``v5e-8``) are not."""
    match = _NODE.fullmatch(name.strip().lower())
    return bool(match) and not match.group(2).startswith("v")


def node(name: str) -> Accelerator:
    """The ``Accelerator`` of ``h100`` (one GPU), ``h100x8`` (one node of 8) or ``2xh100x8``
    (2 nodes of 8): platform "cuda", topology "HOSTSx1xGPUS"; ValueError naming the GPUs."""
    match = _NODE.fullmatch(name.strip().lower())
    gpu = GPUS.get(match.group(2)) if match else None
    if gpu is None:
        raise ValueError(f"unknown GPU {name!r} (GPUs: {', '.join(GPUS)}; a node of 8: h100x8; "
                         "two nodes: 2xh100x8)")
    hosts, per_host = int(match.group(1) or 1), int(match.group(3) or 1)
    if hosts < 1 or per_host < 1 or (hosts > 1 and match.group(3) is None):
        raise ValueError(f"GPU node {name!r}: give GPUs a node and nodes as NODESxGPUxPER_NODE "
                         "(2xh100x8)")
    return Accelerator(name, gpu, f"{hosts}x1x{per_host}", hosts * per_host, platform="cuda")


def target_config(gpu: Gpu, dnn_version: tuple[int, int, int] = (9, 0, 0)) -> str:
    """``gpu`` as a ``GpuTargetConfigProto`` in text form: what XLA:GPU reads of a device it
    compiles for without one (limits, SMs, clock, memory, caches, compute capability)."""
    major, minor = gpu.compute_capability
    info = {
        "threads_per_block_limit": THREADS_PER_BLOCK, "threads_per_warp": THREADS_PER_WARP,
        "shared_memory_per_block": SHARED_MEMORY_PER_BLOCK,
        "shared_memory_per_core": gpu.shared_memory_per_sm,
        "threads_per_core_limit": THREADS_PER_SM, "core_count": gpu.sms,
        "fpus_per_core": gpu.fp32_lanes_per_sm,
        "block_dim_limit_x": GRID_DIM_LIMIT[0], "block_dim_limit_y": GRID_DIM_LIMIT[1],
        "block_dim_limit_z": GRID_DIM_LIMIT[2],
        "memory_bandwidth": int(gpu.hbm_bandwidth), "l2_cache_size": gpu.l2_bytes,
        "clock_rate_ghz": gpu.clock_ghz, "device_memory_size": gpu.hbm_bytes,
        "shared_memory_per_block_optin": gpu.shared_memory_per_block_optin,
        "registers_per_core_limit": REGISTERS_PER_SM,
        "registers_per_block_limit": REGISTERS_PER_BLOCK,
    }
    lines = ["gpu_device_info {", *(f"  {key}: {value}" for key, value in info.items()),
             f"  cuda_compute_capability {{ major: {major} minor: {minor} }}", "}",
             'platform_name: "CUDA"',
             "dnn_version_info {{ major: {} minor: {} patch: {} }}".format(*dnn_version),
             f'device_description_str: "{gpu.device_kind}"']
    return "\n".join(lines) + "\n"


def dnn_version() -> tuple[int, int, int]:
    """The installed cuDNN's version (the CUDA plugin's ``nvidia-cudnn-cu12``; a run on a GPU
    loads the same), (9, 0, 0) where it is not found."""
    from importlib import metadata
    try:
        parts = [int(p) for p in metadata.version("nvidia-cudnn-cu12").split(".")[:3]]
    except (metadata.PackageNotFoundError, ValueError):
        return (9, 0, 0)
    return tuple((parts + [0, 0, 0])[:3])


def at_precision(gpu: Gpu, dtype: str, matmul_precision: str) -> Gpu:
    """``gpu`` with ``peak_flops`` the dense peak its matmuls run at: bf16 for a bfloat16 model;
    for float32, fp32 (no tensor cores) at ``highest``, else tf32 (XLA:GPU's default for f32
    dots on tensor cores)."""
    if dtype == "bfloat16":
        return gpu
    if matmul_precision == "highest":
        return dataclasses.replace(gpu, peak_flops=gpu.peak_fp32, peak_name="fp32")
    return dataclasses.replace(gpu, peak_flops=gpu.peak_tf32, peak_name="tf32")
