"""Which GPU a llama.cpp build runs on, and how many of a model's layers go to it."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import cache

from localspec.common.gguf_header import read_header

from .library import init_library


@dataclass(frozen=True)
class GpuDevice:
    name: str
    free_bytes: int


_GPU_TYPES = (1, 2)  # GGML_BACKEND_DEVICE_TYPE_GPU and _IGPU
_HOST_BACKENDS = (b"CPU", b"RPC", b"BLAS")  # ggml backends whose devices are not this machine's GPU
# What a GPU keeps free beside the layers it takes: the KV cache, the compute buffers.
GPU_RESERVE = 1 << 30


@cache
def gpu_device() -> GpuDevice | None:
    """The GPU this llama.cpp build runs on (a Metal, CUDA or Vulkan build), or None. Asked of
    ggml's device list: llama_supports_gpu_offload() says yes for any build with RPC, and an
    RPC server's device is another machine's."""
    lib = _ggml()
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.ggml_backend_dev_count.restype = sz
    lib.ggml_backend_dev_get.argtypes, lib.ggml_backend_dev_get.restype = [sz], vp
    lib.ggml_backend_dev_type.argtypes, lib.ggml_backend_dev_type.restype = [vp], ctypes.c_int
    lib.ggml_backend_dev_description.argtypes, lib.ggml_backend_dev_description.restype = [vp], ctypes.c_char_p
    lib.ggml_backend_dev_backend_reg.argtypes, lib.ggml_backend_dev_backend_reg.restype = [vp], vp
    lib.ggml_backend_dev_memory.argtypes = [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) not in _GPU_TYPES:
            continue
        if (lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)) or b"") == b"RPC":
            continue
        free, total = sz(), sz()
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        return GpuDevice((lib.ggml_backend_dev_description(dev) or b"GPU").decode(), int(free.value))
    return None


@cache
def gpu_backends() -> tuple[str, ...]:
    """The GPU backends this llama.cpp build has (("Vulkan",), ("CUDA",)...), whether or not
    they see a device: a Vulkan build on a machine whose only Vulkan device is a software one
    (Mesa's lavapipe) sees none unless GGML_VK_VISIBLE_DEVICES names it."""
    lib = _ggml()
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.argtypes, lib.ggml_backend_reg_get.restype = [ctypes.c_size_t], ctypes.c_void_p
    names = (lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)) or b"" for i in range(lib.ggml_backend_reg_count()))
    return tuple(name.decode() for name in names if name and name not in _HOST_BACKENDS)


def _ggml() -> ctypes.CDLL:
    """llama.cpp's library, initialised, with the one ggml call both questions above share typed."""
    from llama_cpp import llama_cpp as raw

    lib: ctypes.CDLL = raw._lib
    lib.ggml_backend_reg_name.argtypes, lib.ggml_backend_reg_name.restype = [ctypes.c_void_p], ctypes.c_char_p
    init_library()
    return lib


def gpu_layers_that_fit(n_layers: int, size_bytes: int, device: GpuDevice | None) -> int:
    """How many of a model's layers go to the GPU: all of them (and the output layer) where
    the weights fit beside GPU_RESERVE, else the share of the layers that does, none without one."""
    if device is None:
        return 0
    room = device.free_bytes - GPU_RESERVE
    if room >= size_bytes:
        return n_layers + 1
    return max(0, n_layers * room // max(size_bytes, 1))


def output_on_gpu(gpu_layers: int, n_layers: int) -> bool:
    """Whether llama.cpp runs the output layer on this build's GPU: it does once every block is
    there (a negative count asks for all of them)."""
    return (gpu_layers < 0 or gpu_layers > n_layers) and gpu_device() is not None


def auto_gpu_layers(path: str, device: GpuDevice | None) -> int:
    """gpu_layers_that_fit for a GGUF file; its header is read only where a GPU is there."""
    if device is None:
        return 0
    meta = read_header(path).meta
    blocks = int(meta.get(f"{meta.get('general.architecture', '')}.block_count", 0) or 0)
    return gpu_layers_that_fit(blocks, os.path.getsize(path), device)
