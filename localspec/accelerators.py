"""Accelerators next to the CPU: NVIDIA GPUs (through torch, when it is installed and sees
CUDA) and Apple Silicon's GPU (unified memory). For each: its name, memory, the bandwidth
its specification gives, and the bandwidth measured with a short copy or sum.

Decoding is bandwidth-bound, so the cost model needs the bandwidth of the memory the
weights live in: the GPU's, not the CPU's, when a backend runs there. Nothing here imports
torch or mlx unless it is installed, and every probe failure means "no such accelerator".
"""

from __future__ import annotations

import importlib.util
import platform
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any

# Unified-memory bandwidth by chip (Apple's specifications, GB/s). Where a chip shipped in
# two memory configurations (the binned M3 Max / M4 Max), the lower one: an overestimate
# would make the cost model too optimistic about long drafts.
APPLE_BANDWIDTH_GBS = {
    "M1": 68.25,
    "M1 Pro": 200.0,
    "M1 Max": 400.0,
    "M1 Ultra": 800.0,
    "M2": 100.0,
    "M2 Pro": 200.0,
    "M2 Max": 400.0,
    "M2 Ultra": 800.0,
    "M3": 100.0,
    "M3 Pro": 150.0,
    "M3 Max": 300.0,
    "M3 Ultra": 819.0,
    "M4": 120.0,
    "M4 Pro": 273.0,
    "M4 Max": 410.0,
}


@dataclass(frozen=True)
class Accelerator:
    kind: str  # "cuda" or "apple"
    name: str
    memory_gib: float
    spec_bandwidth_gbs: float | None  # from the device's properties or the chip's specification
    measured_bandwidth_gbs: float | None  # None when it could not be measured

    @property
    def bandwidth_gbs(self) -> float | None:
        """What the cost model uses: measured when there is a figure, else the specification."""
        return self.measured_bandwidth_gbs or self.spec_bandwidth_gbs


def apple_chip_bandwidth(brand: str) -> float | None:
    """GB/s for a brand string such as "Apple M2 Max"; None for an unknown chip."""
    match = re.search(r"\b(M\d+)(?:\s+(Pro|Max|Ultra))?\b", brand)
    if match is None:
        return None
    chip = match.group(1) + (f" {match.group(2)}" if match.group(2) else "")
    return APPLE_BANDWIDTH_GBS.get(chip)


def cuda_spec_bandwidth(properties: Any) -> float | None:
    """Peak GB/s from torch's device properties: memory clock (kHz) × bus width × 2 (DDR).
    None when this torch does not report them."""
    clock_khz = getattr(properties, "memory_clock_rate", None)
    bus_bits = getattr(properties, "memory_bus_width", None)
    if not clock_khz or not bus_bits:
        return None
    return 2 * float(clock_khz) * 1e3 * float(bus_bits) / 8 / 1e9


def _measure_cuda(torch: Any, index: int, mib: int = 512, repeats: int = 10) -> float:
    device = torch.device("cuda", index)
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch and kernel load are not bandwidth
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    seconds = float(start.elapsed_time(end)) / 1e3
    return 2 * repeats * mib * 2**20 / seconds / 1e9  # a copy reads and writes every byte


def cuda_devices() -> list[Accelerator]:
    if importlib.util.find_spec("torch") is None:
        return []
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            try:
                measured: float | None = _measure_cuda(torch, i)
            except RuntimeError:  # out of memory, or a device in exclusive use
                measured = None
            out.append(
                Accelerator("cuda", props.name, props.total_memory / 2**30, cuda_spec_bandwidth(props), measured)
            )
        return out
    except Exception:  # a broken driver or CUDA install: the CPU is still there
        return []


def _measure_mlx(mib: int = 512, repeats: int = 5) -> float | None:
    if importlib.util.find_spec("mlx") is None:
        return None
    import mlx.core as mx

    data = mx.ones((mib * 2**20 // 4,), dtype=mx.float32)
    mx.eval(data.sum())  # materialise and warm up
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(data.sum())
        best = max(best, mib * 2**20 / (time.perf_counter() - t0) / 1e9)
    return best


def apple_gpu() -> list[Accelerator]:
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return []
    try:
        brand = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        memory = int(
            subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True, timeout=5).stdout.strip()
        )
    except (OSError, ValueError, subprocess.SubprocessError):
        return []
    try:
        measured = _measure_mlx()
    except Exception:  # mlx present but unusable (no Metal device in a VM)
        measured = None
    return [Accelerator("apple", brand or "Apple Silicon", memory / 2**30, apple_chip_bandwidth(brand), measured)]


def probe_accelerators() -> tuple[Accelerator, ...]:
    return (*cuda_devices(), *apple_gpu())
