"""The CUDA devices torch sees, for the device probe (localspec.control.accelerators): name, memory,
the peak bandwidth from the device's properties and the bandwidth of a measured copy."""

from __future__ import annotations

import torch

from localspec.control.accelerators import Accelerator, cuda_spec_bandwidth


def _measure(index: int, mib: int = 512, repeats: int = 10) -> float:
    device = torch.device("cuda", index)
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch and kernel load are not bandwidth
    timer = torch.cuda.Event  # untyped in torch's stubs
    start, end = timer(enable_timing=True), timer(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    seconds = float(start.elapsed_time(end)) / 1e3
    return 2 * repeats * mib * 2**20 / seconds / 1e9  # a copy reads and writes every byte


def accelerators() -> list[Accelerator]:
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        try:
            measured: float | None = _measure(i)
        except RuntimeError:  # out of memory, or a device in exclusive use
            measured = None
        out.append(Accelerator("cuda", props.name, props.total_memory / 2**30, cuda_spec_bandwidth(props), measured))
    return out
