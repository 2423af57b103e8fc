"""The torch backend on a CUDA GPU: the path CI cannot run (it has no GPU), checked on one.

Run where a GPU is: `python -m pytest tests/backends/torch/test_torch_cuda.py` (skipped without CUDA). The
real-model tests read the embedded SmolLM2-135M GGUF from LOCALSPEC_TEST_GGUF when set (a
GPU machine without network), else fetch it as the other real-model tests do.

What the GPU path changes, and so what is checked here: steps replay captured CUDA graphs
(static buffers, whole-cache attention masked from a positions tensor), weights are bf16 by
default (a 4-bit GGUF stays int4, a 5-8-bit one int8, read by torch's packed kernels), the
acceptance rule runs on the device, and the self-drafters' matrices are low-bit too. The reference is the
same backend on the CPU in float32 (itself checked against llama.cpp in CI).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch backend tests need PyTorch: pip install 'localspec[torch]'")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: these tests run where an NVIDIA GPU is", allow_module_level=True)

from test_exactness import chi_square_pvalue, exact_joint  # noqa: E402
from test_torch_tiny_models import (  # noqa: E402
    EXACT_PROMPT,
    SMALL,
    TEXT_IDS,
    ExactLaw,
    Spec,
    blockwise,
    sampled_outcomes,
    tiny,
)

from localspec.api import runtime_for  # noqa: E402
from localspec.backends.torch import TorchBackend  # noqa: E402
from localspec.common.templates import render_chat  # noqa: E402
from localspec.control.prompts import SUITE  # noqa: E402
from localspec.core.engine import Engine  # noqa: E402
from localspec.core.sampling import SamplingConfig  # noqa: E402
from localspec.drafters.model import ModelDrafter  # noqa: E402
from localspec.drafters.ngram import NgramDrafter  # noqa: E402
from localspec.testing.benchmarks import load_benchmark  # noqa: E402


def on_gpu(path: Path, **options: object) -> TorchBackend:
    return TorchBackend(str(path), n_ctx=options.pop("n_ctx", 256), device="cuda", **options)  # type: ignore[arg-type]


# -- tiny models: the graphed path computes what the CPU computes -------------------------------


@pytest.mark.parametrize("spec", [Spec("llama"), Spec("qwen2"), Spec("gemma3")], ids=lambda s: s.arch)
def test_cuda_graph_replays_compute_what_the_eager_cuda_path_does(models, spec: Spec) -> None:
    path = models(spec)
    eager = blockwise(on_gpu(path, dtype="float32", cuda_graphs=False), TEXT_IDS)
    graphed = blockwise(on_gpu(path, dtype="float32"), TEXT_IDS)
    np.testing.assert_allclose(graphed, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", [Spec("llama"), Spec("qwen2"), Spec("gemma3")], ids=lambda s: s.arch)
def test_cuda_float32_computes_the_model_the_cpu_computes(models, spec: Spec) -> None:
    # Loose on purpose: some hosts' CPU matmuls round float32 through bfloat16 (oneDNN on
    # AMX machines); a wrong mask, position or cache row moves logits by far more.
    path = models(spec)
    cpu = blockwise(tiny(str(path)), TEXT_IDS)
    gpu = blockwise(on_gpu(path, dtype="float32"), TEXT_IDS)
    assert np.abs(gpu - cpu).max() < 0.03 * np.abs(cpu).max()
    assert (gpu.argmax(1) == cpu.argmax(1)).mean() >= 0.95


def test_closing_a_graphed_drafter_leaves_later_captures_working(models) -> None:
    # Measuring several early exits closes each; their graphs must go before the next capture.
    target = on_gpu(models(Spec("llama", layers=8)), n_ctx=128)
    for exit in (4, 5, 6, 7):
        view = target.early_exit(exit)
        for n in (1, 2, 3):
            view.eval_block(TEXT_IDS[:n], "all")
            view.rollback(0)
        view.close()
    assert target.eval_block(TEXT_IDS[:3], "all").shape[0] == 3


def test_the_first_verify_block_captures_every_block_size_and_later_blocks_read_the_right_rows(models) -> None:
    # A draft length first met mid-answer must not pay for its graph there; the captures'
    # warm-ups write cache rows ahead of the text, which later blocks must overwrite.
    path = models(Spec("llama"))
    backend = on_gpu(path, dtype="float32")
    backend.eval_block(TEXT_IDS[:5], "none")
    backend.eval_block(TEXT_IDS[5:6], "all")
    steps = backend._graphs
    assert steps is not None
    assert {n for n, mode in steps.graphs if mode == "all"} == set(range(1, steps.max_tokens + 1))
    assert {n for n, mode in steps.graphs if mode == "none"} == {5}  # other modes: the size met
    later = backend.eval_block(TEXT_IDS[6:9], "all").copy()
    fresh = on_gpu(path, dtype="float32", cuda_graphs=False).eval_block(TEXT_IDS[:9], "all")[6:]
    np.testing.assert_allclose(later, fresh, rtol=1e-5, atol=1e-5)


def test_cuda_bfloat16_logits_stay_close_to_float32(models) -> None:
    path = models(Spec("llama"))
    full = blockwise(on_gpu(path, dtype="float32"), TEXT_IDS)
    half = blockwise(on_gpu(path), TEXT_IDS)  # the CUDA default
    assert np.abs(half - full).max() < 0.05 * np.abs(full).max()


def test_rollback_on_cuda_then_new_tokens_equals_evaluating_fresh(models) -> None:
    path = models(Spec("gemma3"))  # sliding-window layers: the mask comes from the positions tensor
    backend = on_gpu(path, dtype="float32")
    backend.eval_block(TEXT_IDS[:12], "none")
    backend.eval_block(TEXT_IDS[12:20], "all")
    backend.rollback(14)
    continued = backend.eval_block([7, 8, 9, 10, 11], "all").copy()
    fresh = on_gpu(path, dtype="float32").eval_block([*TEXT_IDS[:14], 7, 8, 9, 10, 11], "all")[14:]
    np.testing.assert_allclose(continued, fresh, rtol=1e-4, atol=1e-4)


def test_torch_compile_inside_the_graphs_computes_the_same_logits(models) -> None:
    path = models(Spec("llama"))
    plain = blockwise(on_gpu(path, dtype="float32"), TEXT_IDS[:12], [1, 3, 1, 7])
    compiled = blockwise(on_gpu(path, dtype="float32", compile=True), TEXT_IDS[:12], [1, 3, 1, 7])
    np.testing.assert_allclose(compiled, plain, rtol=1e-3, atol=1e-3)


# -- tiny models: speculation on the GPU is exact -----------------------------------------------


@pytest.mark.parametrize(
    "drafter", ["model", "ngram", "qspec-int8", "qspec-int4", "layerskip"], ids=lambda d: f"{d}-on-cuda"
)
def test_speculative_sampling_on_cuda_follows_the_target_law(models, drafter: str) -> None:
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0)
    target = on_gpu(models(SMALL), n_ctx=64, dtype="float32")
    drafters: dict[str, Callable[[], object]] = {
        "model": lambda: ModelDrafter(on_gpu(models(replace(SMALL, noise=0.5)), n_ctx=64, dtype="float32")),
        "ngram": lambda: NgramDrafter(min_ngram=1),
        "qspec-int8": lambda: ModelDrafter(target.quantized(8)),
        "qspec-int4": lambda: ModelDrafter(target.quantized(4)),
        "layerskip": lambda: ModelDrafter(target.early_exit(1)),
    }
    observed = sampled_outcomes(Engine(target, drafters[drafter]()), cfg)  # type: ignore[arg-type]
    # The law comes from plain eager evaluation of the same float32 model on the GPU.
    reference = on_gpu(models(SMALL), n_ctx=64, dtype="float32", cuda_graphs=False)
    law = exact_joint(ExactLaw(reference), EXACT_PROMPT, cfg)  # type: ignore[arg-type]
    assert chi_square_pvalue(observed, law) > 1e-3


# -- the real model -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(request: pytest.FixtureRequest) -> Path:
    given = os.environ.get("LOCALSPEC_TEST_GGUF")
    if given:
        return Path(given)
    return Path(request.getfixturevalue("smollm2_q4_1"))


@pytest.fixture(scope="module")
def gpu_bf16(smollm2: Path) -> Iterator[TorchBackend]:
    backend = on_gpu(smollm2, n_ctx=1024)
    yield backend
    backend.close()


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def tie_margin(backend: TorchBackend, context: list[int], x: int, y: int) -> float:
    """How far apart the plain pass put two tokens' logits after `context`."""
    backend.rollback(0)
    row = backend.eval_block(context, "last")[-1]
    backend.rollback(0)
    return float(abs(row[x] - row[y]))


def chat_ids(backend: TorchBackend, messages: list[dict[str, str]]) -> list[int]:
    text = render_chat(backend.chat_template(), messages, backend.special_texts())
    return backend.tokenize(text, add_special=False, parse_special=True)


@pytest.mark.model
@pytest.mark.parametrize("strategy", ["ngram", "layerskip:20", "qspec:int8", "qspec:int4"])
def test_greedy_speculation_on_cuda_reproduces_plain_decoding(gpu_bf16: TorchBackend, strategy: str) -> None:
    messages = SUITE[0].messages  # the code edit: drafts get accepted
    plain = runtime_for(gpu_bf16, strategy="none", calibrate=False).generate(
        messages=messages, max_tokens=64, temperature=0
    )
    kind, _, option = strategy.partition(":")
    drafter = gpu_bf16.make_self_drafter(kind, option or None) if kind != "ngram" else None
    runtime = runtime_for(gpu_bf16, drafter, strategy="draft" if drafter else "ngram", draft_tokens=4, calibrate=False)
    spec = runtime.generate(messages=messages, max_tokens=64, temperature=0)
    assert spec.stats.accepted > 0
    at = first_divergence(spec.tokens, plain.tokens)
    if at is not None:
        # bf16 on a GPU: a batched pass and a single-token pass run different kernels, so an
        # exact near-tie may resolve the other way; anything else is a bug.
        context = chat_ids(gpu_bf16, messages)
        margin = tie_margin(gpu_bf16, [*context, *plain.tokens[:at]], plain.tokens[at], spec.tokens[at])
        assert margin < 0.07, f"diverged at token {at} with a logit margin of {margin}"


@pytest.mark.model
def test_cuda_float32_top1_agrees_with_the_cpu_and_bf16_nearly(smollm2: Path) -> None:
    cpu = TorchBackend(str(smollm2), n_ctx=512, device="cpu", threads=os.cpu_count())
    tokens = cpu.tokenize(SUITE[0].messages[-1]["content"] * 3, add_special=True, parse_special=False)[:300]
    reference = np.concatenate([cpu.eval_block(tokens[i : i + 13], "all").argmax(1) for i in range(0, 300, 13)])
    cpu.close()
    for dtype, floor in (("float32", 0.99), ("bfloat16", 0.97)):
        gpu = on_gpu(smollm2, n_ctx=512, dtype=dtype, weights="dense")
        rows = np.concatenate([gpu.eval_block(tokens[i : i + 13], "all").argmax(1) for i in range(0, 300, 13)])
        gpu.close()
        assert float((rows == reference).mean()) >= floor, dtype


# -- quantized targets and verification on the device ---------------------------------------------


def test_cuda_verifies_on_the_device_by_default(models) -> None:
    assert on_gpu(models(SMALL)).capabilities.verifies


@pytest.mark.parametrize("rows", [1, 5, 16])
def test_the_cuda_int4_kernel_computes_what_the_cpu_kernel_does_on_the_same_codes(rows: int) -> None:
    from localspec.backends.torch import quantized
    from localspec.backends.torch.linear import Int4

    weight = torch.randn(200, 512, generator=torch.Generator().manual_seed(0))
    codes = quantized.quantize_groups(weight)
    # bf16 scales and zeros on CUDA: the CPU's float32 ones rounded to 8 significant bits
    codes = quantized.GroupCodes(codes.codes, codes.scale.bfloat16().float(), codes.zero.bfloat16().float())
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(1))
    gpu = Int4(codes.to(torch.device("cuda")))
    assert gpu.packed_cuda
    expected = x @ codes.dequantized().T
    got = gpu(x.cuda().bfloat16()).float().cpu()
    assert (got - expected).abs().max() < 0.02 * expected.abs().max()


def test_the_cuda_int8_layer_computes_its_codes_values() -> None:
    from localspec.backends.torch import quantized
    from localspec.backends.torch.linear import Int8

    codes = quantized.quantize_rows(torch.randn(200, 512, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(1))
    got = Int8(codes.to(torch.device("cuda")))(x.cuda().bfloat16()).float().cpu()
    expected = x @ codes.dequantized().T
    assert (got - expected).abs().max() < 0.02 * expected.abs().max()


@pytest.mark.model
def test_a_q4_1_target_stays_int4_on_cuda_and_takes_what_its_accounting_says(smollm2: Path) -> None:
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    gpu = on_gpu(smollm2, n_ctx=512)
    assert gpu.capabilities.extra["weights"] == "int4"
    weights = torch.cuda.memory_allocated() - before - 2 * gpu.cache.k.numel() * gpu.cache.k.element_size()
    assert weights < 1.2 * gpu.info.size_bytes  # the kernels' packing pads little
    cpu = TorchBackend(str(smollm2), n_ctx=512, device="cpu", weights="int4")
    tokens = cpu.tokenize(SUITE[0].messages[-1]["content"], add_special=True, parse_special=False)[:120]
    a = np.concatenate([cpu.eval_block(tokens[i : i + 12], "all").argmax(1) for i in range(0, 120, 12)])
    b = np.concatenate([gpu.eval_block(tokens[i : i + 12], "all").argmax(1) for i in range(0, 120, 12)])
    assert float((a == b).mean()) >= 0.95  # the same codes; bf16 scales and activations on the GPU
    gpu.close()


@pytest.mark.model
@pytest.mark.parametrize("strategy", ["ngram", "qspec:int8"])
def test_greedy_speculation_on_an_int4_target_verified_on_cuda_reproduces_plain_decoding(
    smollm2: Path, strategy: str
) -> None:
    target = on_gpu(smollm2, n_ctx=1024, weights="int4")
    assert target.capabilities.verifies
    messages = SUITE[0].messages
    plain = runtime_for(target, strategy="none", calibrate=False).generate(
        messages=messages, max_tokens=64, temperature=0
    )
    kind, _, option = strategy.partition(":")
    drafter = target.make_self_drafter(kind, option or None) if kind != "ngram" else None
    runtime = runtime_for(target, drafter, strategy="draft" if drafter else "ngram", draft_tokens=4, calibrate=False)
    spec = runtime.generate(messages=messages, max_tokens=64, temperature=0)
    assert spec.stats.accepted > 0
    at = first_divergence(spec.tokens, plain.tokens)
    if at is not None:  # as above: only an exact near-tie may resolve the other way in bf16
        context = chat_ids(target, messages)
        margin = tie_margin(target, [*context, *plain.tokens[:at]], plain.tokens[at], spec.tokens[at])
        assert margin < 0.07, f"diverged at token {at} with a logit margin of {margin}"


def test_the_gpu_shapes_benchmark_runs_the_real_shapes_on_cuda(capsys) -> None:
    gpu_shapes = load_benchmark("gpu_shapes")

    gpu_shapes.main(["--reps", "3", "--kinds", "int4"])
    out = capsys.readouterr().out
    assert out.count("llama-3.1-8b <- llama-3.2-1b") == len(gpu_shapes.ALPHAS)
