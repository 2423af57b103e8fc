"""Accelerators next to the CPU: NVIDIA GPUs (probed by the torch backend when torch sees
CUDA) and Apple Silicon's GPU (probed by the MLX backend). For each: its name, memory, the
bandwidth its specification gives, and the bandwidth measured with a short copy or sum.

Decoding is bandwidth-bound, so the cost model needs the bandwidth of the memory the
weights live in: the GPU's, not the CPU's, when a backend runs there. Every probe failure
means "no such accelerator", never an error.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from typing import Any

from localspec.core.backend_loader import BACKENDS

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


def probe_accelerators() -> tuple[Accelerator, ...]:
    """Every accelerator an installed backend can see; the backends own the probing, since
    only they may import torch or mlx."""
    found: list[Accelerator] = []
    for name, package in (("torch", "torch"), ("mlx", "mlx")):
        if importlib.util.find_spec(package) is None:
            continue
        try:
            module = importlib.import_module(f"{BACKENDS[name]}.device_probe")
            found.extend(module.accelerators())
        except Exception:  # a broken driver or install: the CPU is still there
            continue
    return tuple(found)
