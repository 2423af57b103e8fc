"""What the machine is: cores now; bandwidth and SIMD probing grow here."""

from __future__ import annotations

import os

import psutil


def physical_cores() -> int:
    # Hyper-threads share a core's vector units; llama.cpp runs best with one thread per core.
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1
