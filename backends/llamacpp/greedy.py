"""Greedy verification inside llama.cpp's graph (its backend sampling): a greedy sampler on the
context's sequence puts an argmax after the output layer, so a pass hands back one token id per
row and no row of logits is copied out of the graph or read by Python. That row is 49,152 floats
on the default model and up to 262,144 on others: reading it cold after a pass was most of a
plain step's host time (benchmarks/host_time.py).

The argmax is the same rule as numpy's on the same logits (the first of equal maxima), over
logits the added node does not change, so the tokens are the ones the host would pick.

It pays only where the output layer runs on a GPU, whose row would cross the bus. On the CPU
ggml's argmax and the padded copy of the logits the sampler adds cost more than the host's
numpy argmax over a row it already holds (benchmarks/host_time.py), so there it stays off."""

from __future__ import annotations

from typing import Any

import llama_cpp as llama

_SEQ = 0  # the backend's one sequence
# llama.cpp's backend sampling hands the argmax each output row as a view at row x n_vocab x 4
# bytes, and ggml's Vulkan argmax aborts the process (GGML_ASSERT in init_pushconst_tensor_offsets)
# unless that offset is a multiple of the device's minStorageBufferOffsetAlignment: 16 on lavapipe,
# at most 256 by Vulkan's spec. Real vocabularies are multiples of 64 tokens; the tests' tiny ones not.
VULKAN_ROW_BYTES = 256


def rows_aligned(n_vocab: int, backends: tuple[str, ...]) -> bool:
    """Whether the in-graph argmax may take a block of several rows on this build's devices."""
    return "Vulkan" not in backends or n_vocab * 4 % VULKAN_ROW_BYTES == 0


class DeviceGreedy:
    """The greedy sampler a context's sequence may carry. Attached only while greedy blocks are
    verified: a pass that wants its logits (sampling, logprobs, penalties) detaches it first.
    Each attach or detach makes llama.cpp plan its compute buffers again (a few milliseconds),
    so it stays attached across greedy requests."""

    def __init__(self, ctx: Any, wanted: bool) -> None:
        self._ctx = ctx
        self._chain: Any = None
        self.attached = False
        # The output layer is on a GPU, where the argmax saves the row's copy; False once
        # llama.cpp refused to sample on this context's device.
        self.wanted = wanted

    def attach(self) -> bool:
        """Whether the sampler is attached now (False where it is not wanted or llama.cpp refused it)."""
        if self.attached or not self.wanted:
            return self.attached
        self.free()  # llama.cpp sets a chain up for the graph once: each attach takes a new one
        self._chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
        llama.llama_sampler_chain_add(self._chain, llama.llama_sampler_init_greedy())
        self.attached = bool(llama.llama_set_sampler(self._ctx, _SEQ, self._chain))
        self.wanted = self.attached
        return self.attached

    def detach(self) -> None:
        if self.attached:
            llama.llama_set_sampler(self._ctx, _SEQ, None)
            self.attached = False

    def picks(self, n: int) -> list[int]:
        """The argmax of each of the last pass's first n rows."""
        get = llama.llama_get_sampled_token_ith  # its restype makes each id a Python int
        return [get(self._ctx, 0)] if n == 1 else [get(self._ctx, i) for i in range(n)]

    def free(self) -> None:
        """Free the sampler once detached, or once the context it was attached to is freed."""
        if self._chain is not None:
            llama.llama_sampler_free(self._chain)
            self._chain = None
