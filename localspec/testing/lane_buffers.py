"""What llama.cpp reserves for one more lane of shared passes, read from its own log: the caches
(KV, recurrent state), compute and output buffers it reports as it opens contexts and grows
their outputs. A pool of `few` lanes and one of `many` each answer a request on every lane at
once; the difference, divided by the lanes added, is one lane's. The tests and
benchmarks/lane_memory.py set it against the estimate that picks serve's default lanes
(backends/llamacpp/lane_memory.py)."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

import localspec
from localspec.backends.llamacpp.library import log_lines

MIB = 1 << 20
_RESERVED = re.compile(r"(KV|RS|compute|output) buffer size\s*=\s*([\d.]+) MiB")
_GROWN = re.compile(r"reallocating output buffer from size ([\d.]+) MiB to ([\d.]+) MiB")


def reserved(text: str) -> dict[str, float]:
    """MiB by kind (KV, RS, compute, output) that llama.cpp reported in `text`: each buffer as it
    was made, and each output buffer's growth since."""
    sizes: dict[str, float] = {}
    for kind, mib in _RESERVED.findall(text):
        sizes[kind] = sizes.get(kind, 0.0) + float(mib)
    for old, new in _GROWN.findall(text):
        sizes["output"] = sizes.get("output", 0.0) + float(new) - float(old)
    return sizes


def pool_reserved(model: str, lanes: int, prompts: Sequence[str], **options: Any) -> dict[str, float]:
    """What a pool of `lanes` lanes reserved, once each lane has answered one of `prompts`."""
    failed: list[BaseException] = []

    def ask(prompt: str) -> None:
        try:
            pool.generate(prompt, max_tokens=8)
        except BaseException as exc:  # a lane that did not answer reserved less: no figure then
            failed.append(exc)

    with log_lines() as heard:
        with localspec.load_pool(model, parallel=lanes, calibrate=False, **options) as pool:
            threads = [threading.Thread(target=ask, args=(prompts[i % len(prompts)],)) for i in range(lanes)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if failed:
            raise failed[0]
        return reserved("".join(heard))


def lane_reserved(model: str, prompts: Sequence[str], few: int = 2, many: int = 4, **options: Any) -> float:
    """Bytes llama.cpp reserved for one more lane (see the module doc)."""
    low, high = (pool_reserved(model, n, prompts, **options) for n in (few, many))
    grown = sum(high.values()) - sum(low.values())
    return grown * MIB / (many - few)
