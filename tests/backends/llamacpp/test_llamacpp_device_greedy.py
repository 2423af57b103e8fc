"""Greedy blocks verified inside llama.cpp's graph (backends/llamacpp/greedy.py) pick the tokens
the host's argmax picks over the same pass's logits, and a request that wants the logits still
gets them. The graph's argmax is for outputs on a GPU; these tests turn it on for the CPU's
(and on a GPU build, .ci/vulkan.sh, compare it with the host's on the device)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from localspec.api import runtime_for
from localspec.core.acceptance import accept_greedy
from localspec.core.protocol import Backend
from localspec.core.sampling import LogprobRecorder, SamplingConfig

pytestmark = pytest.mark.model

GREEDY = SamplingConfig(temperature=0.0)
PROMPT = "The three largest cities of France are"


def output_on_a_gpu(backend: Backend) -> bool:
    """Whether this build put the target's output layer on a GPU (a Vulkan or CUDA build), where
    greedy blocks take the graph's argmax by themselves."""
    return backend.capabilities.device == "gpu"


@pytest.fixture
def in_graph(target_backend: Backend) -> Iterator[Backend]:
    """The target with the graph's argmax wanted, as where its output layer is on a GPU."""
    greedy = target_backend._greedy  # type: ignore[attr-defined]
    assert greedy.wanted == output_on_a_gpu(target_backend)  # the CPU's output row is the host's to read
    greedy.wanted = True
    try:
        yield target_backend
    finally:
        greedy.detach()
        greedy.wanted = output_on_a_gpu(target_backend)


def verified_both_ways(backend: Backend, block: list[int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """verify_block's answer, then the host's rule over eval_block's logits of the same pass."""
    past = backend.n_past
    on_device = backend.verify_block(block, None, GREEDY, np.random.default_rng(0))  # type: ignore[attr-defined]
    backend.rollback(past)
    on_host = accept_greedy(block[1:], backend.eval_block(block, "all"))
    backend.rollback(past)
    return on_device, on_host


def test_a_greedy_block_takes_the_argmax_the_host_takes(in_graph: Backend) -> None:
    target_backend = in_graph
    prompt = target_backend.tokenize(PROMPT, add_special=True, parse_special=False)
    target_backend.rollback(0)
    target_backend.eval_block(prompt[:-1], "none")
    plain = verified_both_ways(target_backend, [prompt[-1]])
    assert plain[0] == plain[1]
    # A draft of what the model says next, then a wrong token: accepted as far as it agrees.
    said = runtime_for(target_backend, strategy="none").generate(PROMPT, max_tokens=6, temperature=0.0).tokens
    target_backend.rollback(len(prompt) - 1)
    block = [prompt[-1], *said[:4], (said[4] + 1) % target_backend.info.n_vocab]
    on_device, on_host = verified_both_ways(target_backend, block)
    assert on_device == on_host == (4, said[4])


def test_greedy_and_sampled_requests_take_turns_on_one_context(in_graph: Backend) -> None:
    target_backend = in_graph
    runtime = runtime_for(target_backend, strategy="none")
    first = runtime.generate(PROMPT, max_tokens=16, temperature=0.0).tokens
    assert target_backend._greedy.attached  # type: ignore[attr-defined]
    sampled = runtime.generate(PROMPT, max_tokens=8, temperature=0.8, seed=3)
    assert not target_backend._greedy.attached  # type: ignore[attr-defined]
    assert len(sampled.tokens) == 8
    assert runtime.generate(PROMPT, max_tokens=16, temperature=0.0).tokens == first
    # Greedy with logprobs reads the rows, so it takes the host's argmax: the same tokens.
    recorder = LogprobRecorder(2, target_backend.token_bytes)
    with_rows = runtime.generate(PROMPT, max_tokens=16, sampling=SamplingConfig(temperature=0.0, logprobs=recorder))
    assert with_rows.tokens == first and len(recorder.entries) == 16


def test_greedy_requests_take_the_graphs_argmax_only_where_the_output_layer_is_on_a_gpu(
    target_backend: Backend,
) -> None:
    runtime = runtime_for(target_backend, strategy="none")
    runtime.generate(PROMPT, max_tokens=4, temperature=0.0)
    assert target_backend._greedy.attached == output_on_a_gpu(target_backend)  # type: ignore[attr-defined]


def test_the_graphs_argmax_and_the_hosts_give_the_same_greedy_text(target_backend: Backend) -> None:
    greedy = target_backend._greedy  # type: ignore[attr-defined]
    runtime = runtime_for(target_backend, strategy="ngram")
    texts: dict[bool, list[int]] = {}
    for wanted in (True, False):
        greedy.detach()
        greedy.wanted = wanted
        try:
            texts[wanted] = runtime.generate(PROMPT, max_tokens=24, temperature=0.0).tokens
            assert greedy.attached == wanted
        finally:
            greedy.detach()
            greedy.wanted = output_on_a_gpu(target_backend)
    assert texts[True] == texts[False]
