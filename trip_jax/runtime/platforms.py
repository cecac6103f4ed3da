"""Which JAX platforms a process may start: no TPU runtime where no TPU chip is attached.

With libtpu installed JAX tries the TPU first in every process (libtpu's errors on stderr, its
lock file), and with a GPU plugin installed the GPU; ``skip_absent_tpu()``, run when ``trip_jax`` is imported, sets ``JAX_PLATFORMS`` to
what is attached unless the user set it. No JAX import. Details: docs/compile.md.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from pathlib import Path

# Google's PCI vendor id and the device ids of TPU chips (as jax._src.hardware_utils reads them).
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076")
NVIDIA_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
ROCM_PLUGINS = ("jax_rocm60_plugin", "jax_rocm7_plugin")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def tpu_chips(pci_root: str = "/sys/bus/pci/devices") -> int:
    """The TPU chips attached to this machine over PCI."""
    count = 0
    for vendor in glob.glob(os.path.join(pci_root, "*", "vendor")):
        try:
            if Path(vendor).read_text().strip() != GOOGLE_PCI_VENDOR:
                continue
            device = (Path(vendor).parent / "device").read_text().strip()
        except OSError:
            continue
        count += device in TPU_PCI_DEVICES
    return count


def attached_platforms(pci_root: str = "/sys/bus/pci/devices") -> str:
    """The ``JAX_PLATFORMS`` value of what is attached: "tpu,cpu" with a TPU chip, "cuda,cpu"
    with an NVIDIA GPU and a CUDA plugin installed ("rocm,cpu" for AMD's), else "cpu"."""
    if tpu_chips(pci_root):
        return "tpu,cpu"
    if any(os.path.exists(p) for p in NVIDIA_DEVICE_FILES) and any(map(installed, CUDA_PLUGINS)):
        return "cuda,cpu"
    if os.path.exists("/dev/kfd") and any(map(installed, ROCM_PLUGINS)):
        return "rocm,cpu"
    return "cpu"


def skip_absent_tpu(environ=os.environ) -> str | None:
    """Sets ``JAX_PLATFORMS`` in ``environ`` to ``attached_platforms()`` when libtpu or a GPU
    plugin (CUDA, ROCm) is installed, no TPU chip is attached and neither ``JAX_PLATFORMS`` nor
    ``JAX_FORCE_TPU_INIT`` is set (also JAX's config when JAX is imported and has no backend
    yet); returns the value set, or None when nothing was changed."""
    plugins = ("libtpu", *CUDA_PLUGINS, *ROCM_PLUGINS)
    if (environ.get("JAX_PLATFORMS") or "JAX_FORCE_TPU_INIT" in environ
            or not any(map(installed, plugins))):
        return None
    platforms = attached_platforms()
    if platforms.startswith("tpu"):
        return None
    environ["JAX_PLATFORMS"] = platforms
    jax = sys.modules.get("jax")
    if jax is not None and environ is os.environ:
        from jax._src import xla_bridge  # JAX read the variable when it was imported
        if not xla_bridge.backends_are_initialized() and jax.config.jax_platforms is None:
            jax.config.update("jax_platforms", platforms)
    return platforms
