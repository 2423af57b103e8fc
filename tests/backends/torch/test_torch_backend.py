"""The torch backend on the embedded SmolLM2-135M GGUF, against llama.cpp on the same files.

Agreement is measured against llama.cpp's F16 kernels: on the Q4_1 file llama.cpp quantizes
the activations to 8 bits before each matmul, which moves its own top-1 choice at about 6% of
the positions of ordinary text (its Q4_1 and F16 runs of the same weights disagree that
often), while the torch backend computes with the dequantized weights in float32.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch backend tests need PyTorch: pip install 'localspec[torch]'")

from localspec.api import runtime_for
from localspec.backends.torch import TorchBackend
from localspec.control.prompts import SUITE
from localspec.core.backend_loader import load_backend
from localspec.core.protocol import Backend

pytestmark = pytest.mark.model

N_CTX = 1024
# Teacher-forced text for the top-1 comparison: prose and code, as the benchmarks use.
PASSAGE = (
    "Speculative decoding lets a small draft model propose several tokens that the large model then checks "
    "in a single forward pass. When the draft is right, the output advances by several tokens for the price "
    "of one pass; when it is wrong, the target's own token is kept and nothing is lost.\n\n"
    "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n\n"
    "The sky is blue because air molecules scatter short wavelengths of sunlight more strongly than long "
    "ones, so blue light reaches our eyes from every direction of the sky."
)
POSITIONS = 300
BLOCK = 13  # verify-sized blocks, not aligned with anything


def load_torch(path: Path) -> TorchBackend:
    # One thread: the test machine's two cores are shared with llama.cpp's threads and other
    # jobs, and torch's threads wait for each other at every operator when a core is taken.
    backend = load_backend("torch", str(path), n_ctx=N_CTX, threads=1)
    assert isinstance(backend, TorchBackend)
    return backend


@pytest.fixture(scope="module")
def torch_q4_1(smollm2_q4_1: Path) -> Iterator[TorchBackend]:
    backend = load_torch(smollm2_q4_1)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def reference_top1(derived_models) -> tuple[list[int], np.ndarray]:
    """The teacher-forced text and llama.cpp's top-1 token at each of its positions, F16 weights."""
    backend = load_backend("llamacpp", str(derived_models["F16"]), n_ctx=N_CTX, threads=1)
    try:
        tokens = teacher_text(backend)
        return tokens, argmax_rows(backend, tokens)
    finally:
        backend.close()


def argmax_rows(backend: Backend, tokens: list[int]) -> np.ndarray:
    backend.rollback(0)
    rows = [backend.eval_block(tokens[i : i + BLOCK], "all").argmax(1) for i in range(0, len(tokens), BLOCK)]
    backend.rollback(0)
    return np.concatenate(rows)


def teacher_text(backend: Backend) -> list[int]:
    tokens = backend.tokenize(PASSAGE * 3, add_special=True, parse_special=False)[:POSITIONS]
    assert len(tokens) == POSITIONS
    return tokens


# -- the tokenizer and the model ---------------------------------------------------------------
# (ids, bytes, specials and the template against llama.cpp: test_vocab_parity.py)


def test_the_model_has_llamacpps_layer_count(torch_q4_1: Backend, target_backend: Backend) -> None:
    assert torch_q4_1.info.n_layers == target_backend.info.n_layers == 30


def test_top1_agrees_with_llamacpp_on_the_same_f16_weights(derived_models, reference_top1) -> None:
    tokens, reference = reference_top1
    torch_f16 = load_torch(derived_models["F16"])
    try:
        assert float((argmax_rows(torch_f16, tokens) == reference).mean()) >= 0.99
    finally:
        torch_f16.close()


def test_top1_on_the_default_gguf_agrees_with_llamacpp_float_kernels(torch_q4_1: Backend, reference_top1) -> None:
    tokens, reference = reference_top1
    assert float((argmax_rows(torch_q4_1, tokens) == reference).mean()) >= 0.99


def test_rollback_then_new_tokens_equals_evaluating_the_new_text_fresh(torch_q4_1: Backend) -> None:
    tokens = teacher_text(torch_q4_1)[:60]
    torch_q4_1.rollback(0)
    torch_q4_1.eval_block(tokens[:40], "none")
    torch_q4_1.eval_block(tokens[40:48], "all")  # a draft of 8 ...
    torch_q4_1.rollback(42)  # ... of which 2 were kept
    continued = torch_q4_1.eval_block(tokens[50:60], "all").copy()
    torch_q4_1.rollback(0)
    fresh = torch_q4_1.eval_block([*tokens[:42], *tokens[50:60]], "all")[42:]
    torch_q4_1.rollback(0)
    np.testing.assert_allclose(continued, fresh, rtol=1e-4, atol=1e-3)


# -- speculation through the engine -------------------------------------------------------------


def test_greedy_speculation_reproduces_plain_decoding(torch_q4_1: TorchBackend, derived_models) -> None:
    messages = SUITE[0].messages  # the code-editing prompt: n-gram drafts get accepted
    plain = runtime_for(torch_q4_1, strategy="none", calibrate=False).generate(
        messages=messages, max_tokens=48, temperature=0
    )
    drafter = load_torch(derived_models["Q8_0"])
    try:
        for runtime in (
            runtime_for(torch_q4_1, strategy="ngram", draft_tokens=4, calibrate=False),
            runtime_for(torch_q4_1, drafter, strategy="draft", draft_tokens=3, calibrate=False),
            # layer-skip self-drafting: the target's first 20 blocks, sharing its weights
            runtime_for(torch_q4_1, torch_q4_1.early_exit(20), strategy="draft", draft_tokens=2, calibrate=False),
            # QSpec-style self-drafting: an int8 copy of the target's matrices
            runtime_for(torch_q4_1, torch_q4_1.quantized(8), strategy="draft", draft_tokens=4, calibrate=False),
        ):
            spec = runtime.generate(messages=messages, max_tokens=48, temperature=0)
            assert spec.tokens == plain.tokens, runtime.strategy
            assert spec.stats.accepted > 0
    finally:
        drafter.close()


def test_the_cuda_attention_layout_is_grouped_query_attention() -> None:
    # The CUDA path hands SDPA the KV heads as its batch and broadcasts keys and mask (stride
    # 0); SDPA on the CPU runs the same layout, so the indexing is checked where CI runs.
    import torch

    from localspec.backends.torch.layers import additive, fused_attention

    gen = torch.Generator().manual_seed(0)
    kv_heads, group, n, dim, keys = 3, 3, 5, 64, 40
    q = torch.randn(n, kv_heads * group, dim, generator=gen).transpose(0, 1)  # [heads, n, dim] as the model has it
    k, v = torch.randn(2, kv_heads, keys, dim, generator=gen)
    positions = torch.arange(keys - n, keys)
    mask = additive(torch.arange(keys)[None, :] <= positions[:, None], torch.float32)
    out = fused_attention(q.view(kv_heads, group, n, dim), k, v, mask, 0.125).reshape(kv_heads * group, n, dim)
    for head in range(kv_heads * group):
        scores = q[head] @ k[head // group].T * 0.125 + mask  # query head h reads KV head h // group
        torch.testing.assert_close(out[head], torch.softmax(scores, -1) @ v[head // group])
