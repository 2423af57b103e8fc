"""CUDA only: decode and verify steps replayed from captured CUDA graphs.

A small model's decode step on a GPU is a few hundred kernel launches of a few microseconds
each, so launch overhead, not the GPU, sets the speed. Each block size n = 1..max_tokens and
logits mode gets one graph, captured on first use (as gpt-fast does for its decode step;
the verify mode's sizes all at once, see GraphedSteps._capture):
its inputs (token ids, positions) live in static buffers, attention reads the whole static
cache through a mask built from the positions tensor (layers.static_block), and the KV rows
are written with index_copy_, so one graph serves every position. Optionally the step is
torch.compile'd first (mode "max-autotune-no-cudagraphs": fused kernels, captured by our
own graphs). The only host synchronisation per step is the copy of the logits the
acceptance rule reads, or, where the backend verifies on the GPU (verify.py), of the two
integers that rule returns: a greedy verify step's graph ends in the rule itself.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from localspec.core.protocol import Logits

from .layers import KVCache, Model, static_block
from .verify import greedy_outcome

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# A verify step's mode whose graph ends in the greedy acceptance rule (verify.greedy_outcome).
GREEDY = "greedy"


class GraphedSteps:
    def __init__(
        self, model: Model, cache: KVCache, max_tokens: int, graphs: bool, compile: bool, n_layers: int | None = None
    ) -> None:
        self.model, self.cache, self.n_layers = model, cache, n_layers
        self.max_tokens = max_tokens
        self.use_graphs = graphs
        device = cache.k.device
        self.tokens = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.arange = torch.arange(cache.n_ctx, device=device)
        vocab = model.output.out_features
        self.host = torch.empty((max_tokens, vocab), dtype=torch.float32, pin_memory=True)
        self.graphs: dict[tuple[int, str], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.steps: dict[str, Step] = {}
        self.compile = compile

    def handles(self, n: int) -> bool:
        return n <= self.max_tokens

    def _step(self, logits: str) -> Step:
        if logits not in self.steps:
            # Locals, not self: no reference cycle, so these graphs die when release() or the
            # last reference drops them, never in a garbage collection during another capture.
            model, cache, n_layers = self.model, self.cache, self.n_layers

            def step(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
                block = static_block(positions, cache.n_ctx, model.window, cache.k.dtype)
                if logits == GREEDY:  # the greedy acceptance inside the graph: two integers out
                    return greedy_outcome(model.forward(tokens, block, cache, "all", n_layers), tokens)
                return model.forward(tokens, block, cache, logits, n_layers).float()

            compiled: Any = torch.compile(step, mode="max-autotune-no-cudagraphs") if self.compile else step
            self.steps[logits] = compiled
        return self.steps[logits]

    def run(self, tokens: Sequence[int], past: int, logits: str) -> Logits:
        out = self.run_on_device(tokens, past, logits)
        rows = out.shape[0]
        if rows == 0:
            return np.empty((0, self.host.shape[1]), dtype=np.float32)
        self.host[:rows].copy_(out, non_blocking=True)
        torch.cuda.current_stream().synchronize()  # the acceptance rule needs the logits now
        array: Logits = self.host[:rows].numpy()
        return array

    def run_on_device(self, tokens: Sequence[int], past: int, logits: str) -> torch.Tensor:
        """The step's float32 logits on the GPU, in the graph's static output buffer (the next
        replay of that graph overwrites them)."""
        n = len(tokens)
        self.tokens[:n].copy_(torch.tensor(tokens, dtype=torch.long), non_blocking=True)
        self.positions[:n].copy_(self.arange[past : past + n])
        ids, positions = self.tokens[:n], self.positions[:n]
        if not self.use_graphs:
            out = self._step(logits)(ids, positions)
        else:
            key = (n, logits)
            if key not in self.graphs:
                self._capture(n, past, logits)
            graph, out = self.graphs[key]
            graph.replay()
        return out

    def release(self) -> None:
        """Destroy the captured graphs now (a closed backend's), not whenever Python gets to it."""
        self.graphs.clear()
        self.steps.clear()

    def _capture(self, n: int, past: int, logits: str) -> None:
        """The graph of this block, and in the verify mode ("all") those of every other size.

        A capture costs about 0.1 s, a 160-token answer on an H100 about 0.35 s: the draft
        length a request meets first mid-answer must not pay for its graph there (on an H100,
        n-gram drafting on a chat prompt ran at 0.74x of plain decoding when it did). The
        warm-up of a size m writes the cache rows [past, past + m): the block's own rows, which
        its replay writes again, and rows ahead of the text, which nothing reads before the
        text reaches them and writes them. Other modes (prefill's "none", a drafter's "last")
        capture the size they meet."""
        sizes = [n]
        if logits in ("all", GREEDY) and past + self.max_tokens <= self.cache.n_ctx:
            sizes = [m for m in range(1, self.max_tokens + 1) if (m, logits) not in self.graphs]
        # A graph destroyed while another is being captured invalidates that capture (CUDA
        # refuses the teardown mid-capture): collect garbage first and not during it.
        enabled = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            self.positions[: max(sizes)].copy_(self.arange[past : past + max(sizes)])
            for m in sizes:
                self.graphs[(m, logits)] = self._capture_step(self.tokens[:m], self.positions[:m], logits)
        finally:
            if enabled:
                gc.enable()

    def _capture_step(
        self, ids: torch.Tensor, positions: torch.Tensor, logits: str
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        step = self._step(logits)
        # Warm up on a side stream (allocator and compile caches). It writes the cache rows of
        # this very block with the values the replay will write again: harmless.
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step(ids, positions)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step(ids, positions)
        return graph, out
