"""Apple Silicon's GPU for the device probe (localspec.control.accelerators): the chip, its unified
memory, the bandwidth Apple specifies for it and the bandwidth of a measured sum."""

from __future__ import annotations

import platform
import subprocess
import time

from localspec.control.accelerators import Accelerator, apple_chip_bandwidth


def _sysctl(name: str) -> str:
    return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()


def _measure(mib: int = 512, repeats: int = 5) -> float:
    import mlx.core as mx

    data = mx.ones((mib * 2**20 // 4,), dtype=mx.float32)
    mx.eval(data.sum())  # materialise and warm up
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(data.sum())
        best = max(best, mib * 2**20 / (time.perf_counter() - t0) / 1e9)
    return best


def accelerators() -> list[Accelerator]:
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return []  # mlx[cpu] on Linux: no GPU behind it
    try:
        brand = _sysctl("machdep.cpu.brand_string")
        memory = int(_sysctl("hw.memsize"))
    except (OSError, ValueError, subprocess.SubprocessError):
        return []
    try:
        measured: float | None = _measure()
    except Exception:  # mlx present but without a Metal device (a VM)
        measured = None
    return [Accelerator("apple", brand or "Apple Silicon", memory / 2**30, apple_chip_bandwidth(brand), measured)]
