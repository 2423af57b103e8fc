"""What the machine is: cores, SIMD, memory bandwidth and a compute rate, and the GPUs next
to the CPU (localspec.control.accelerators), probed once and cached, so a cost model can predict a
model's step time before anything is measured."""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass
from functools import cache

import numpy as np
import psutil

from localspec.control.accelerators import Accelerator, probe_accelerators
from localspec.store import data_dir, save_json_quietly

SIMD_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile", "neon", "sve")


def physical_cores() -> int:
    # Hyper-threads share a core's vector units; llama.cpp runs best with one thread per core.
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


@dataclass(frozen=True)
class DeviceProbe:
    cpu: str
    machine: str
    physical_cores: int
    logical_cores: int
    memory_gib: float
    simd: tuple[str, ...]
    bandwidth_gbs: float  # measured read bandwidth, all physical cores
    gflops: float  # measured float32 matmul rate
    accelerators: tuple[Accelerator, ...] = ()

    def accelerator_for(self, device: str) -> Accelerator | None:
        """The accelerator a backend reporting `device` runs on ("cuda", "gpu", "mps", "metal");
        None for the CPU."""
        kind = {"cuda": "cuda", "gpu": "apple", "mps": "apple", "metal": "apple"}.get(device)
        return next((a for a in self.accelerators if a.kind == kind), None)


@cache
def _cpu_info() -> tuple[str, frozenset[str]]:
    """The CPU's name and every feature flag it reports."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name") and name in ("", platform.machine(), platform.processor()):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
    except OSError:
        pass  # not Linux: the name from platform is what we have
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        flags.add("neon")
    return name, frozenset(flags)


def _cpu_name_and_flags() -> tuple[str, tuple[str, ...]]:
    name, flags = _cpu_info()
    return name, tuple(f for f in SIMD_FLAGS if f in flags)


def cpu_flags() -> frozenset[str]:
    return _cpu_info()[1]


def host_kind() -> str:
    """The host kind figures and exactness claims name: the widest vector extension and the
    features that change which kernels llama.cpp's CPU build takes (VNNI, BF16, AMX)."""
    flags = cpu_flags()
    if "avx512f" in flags:
        extras = [
            label
            for flag, label in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"), ("amx_tile", "AMX"))
            if flag in flags
        ]
        return "AVX-512" + (f" ({', '.join(extras)})" if extras else "")
    for flag, label in (("avx2", "AVX2"), ("avx", "AVX"), ("neon", "NEON"), ("asimd", "NEON")):
        if flag in flags:
            return label
    return platform.machine() or "unknown"


def measure_bandwidth(threads: int, mib_per_thread: int = 256, repeats: int = 3) -> float:
    """GB/s read by `threads` threads each summing its own buffer (numpy releases the GIL)."""
    buffers = [np.ones(mib_per_thread * 2**20 // 8) for _ in range(threads)]
    best = 0.0
    for _ in range(repeats):
        workers = [threading.Thread(target=np.add.reduce, args=(b,)) for b in buffers]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - t0
        best = max(best, threads * mib_per_thread * 2**20 / elapsed / 1e9)
    return best


def measure_gflops(n: int = 1024, repeats: int = 3) -> float:
    a = np.ones((n, n), dtype=np.float32)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ a
        best = max(best, 2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return best


def _cache_file() -> str:
    return str(data_dir() / "device.json")


@cache
def machine_key() -> str:
    """What tells this machine's CPU from another for cached measurements. The SIMD flags
    are part of it: a cloud VM keeps its CPU name ("AMD EPYC") when it lands on a host of
    another generation (one without AVX-512, where F16 SmolLM2-135M's pass took 15 ms
    instead of 11), and a figure measured there misleads here."""
    name, simd = _cpu_name_and_flags()
    return f"{name}|{','.join(simd)}|{physical_cores()}|{os.cpu_count()}"


def _cached_probe() -> DeviceProbe | None:
    try:
        with open(_cache_file()) as fh:
            cached = json.load(fh)
        if cached.get("key") == machine_key():
            data = cached["probe"]
            data["simd"] = tuple(data["simd"])
            data["accelerators"] = tuple(Accelerator(**a) for a in data["accelerators"])
            return DeviceProbe(**data)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # measure again
    return None


def cpu_probe() -> DeviceProbe:
    """The cached probe, or the CPU's rates measured now on small buffers (a tenth of a
    second) without looking for accelerators, whose probe may import torch: what a cost
    prior on the CPU needs before a model's first token."""
    cached = _cached_probe()
    return cached if cached is not None else _quick_cpu_probe()


@cache
def _quick_cpu_probe() -> DeviceProbe:
    name, simd = _cpu_name_and_flags()
    cores = physical_cores()
    return DeviceProbe(
        cpu=name,
        machine=platform.machine(),
        physical_cores=cores,
        logical_cores=os.cpu_count() or 1,
        memory_gib=psutil.virtual_memory().total / 2**30,
        simd=simd,
        bandwidth_gbs=measure_bandwidth(cores, mib_per_thread=64),
        gflops=measure_gflops(n=512),
    )


def probe(refresh: bool = False) -> DeviceProbe:
    """The probe for this machine, measured once (about a second) and cached."""
    name, simd = _cpu_name_and_flags()
    key = machine_key()
    cached = None if refresh else _cached_probe()
    if cached is not None:
        return cached
    result = DeviceProbe(
        cpu=name,
        machine=platform.machine(),
        physical_cores=physical_cores(),
        logical_cores=os.cpu_count() or 1,
        memory_gib=psutil.virtual_memory().total / 2**30,
        simd=simd,
        bandwidth_gbs=measure_bandwidth(physical_cores()),
        gflops=measure_gflops(),
        accelerators=probe_accelerators(),
    )
    save_json_quietly(
        _cache_file(), {"key": key, "probe": asdict(result)}, "the machine probe (measured again next time)"
    )
    return result


def predict_verify_seconds(size_bytes: int, n_params: int, device: DeviceProbe, k: int, on: str = "cpu") -> float:
    """A roofline guess before calibration: one pass streams the weights once, and costs
    2·params flops per token; the slower of the two bounds wins. On an accelerator (`on`
    as a backend reports its device) the weights stream from its memory; its compute rate
    is not probed, and for the few tokens of a verify block it is rarely the bound."""
    accelerator = device.accelerator_for(on)
    if accelerator is not None and accelerator.bandwidth_gbs:
        return size_bytes / (accelerator.bandwidth_gbs * 1e9)
    memory = size_bytes / (device.bandwidth_gbs * 1e9)
    compute = k * 2 * n_params / (device.gflops * 1e9)
    return max(memory, compute)
