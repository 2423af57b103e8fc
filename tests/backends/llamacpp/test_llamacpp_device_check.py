"""bit_exact on a GPU device is checked, not assumed: a model loaded on a device compares blocks
of 2, 3, ... tokens against one-token passes there (backends/llamacpp/device_check.py), and a
run is reported plain decoding's by construction only for the block sizes that check covered.

On a CPU build the check itself runs on the CPU, where kernels.py already knows which kernels
part (ground truth for the check), and a CPU load keeps that plan untouched. The device tests
run on a GPU build (.ci/vulkan.sh: Mesa's software Vulkan device)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")

from localspec.api import runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.backends.llamacpp.device_check import CHECKED_ROWS, identical_block_rows
from localspec.backends.llamacpp.gpu import gpu_backends, gpu_device
from localspec.backends.llamacpp.greedy import rows_aligned
from localspec.backends.llamacpp.kernels import kernels_for
from localspec.backends.llamacpp.library import batch_invariant_build
from localspec.testing.gguf_writer import Spec, write_gguf

REPEATING = "the world and the world and the world and the"
on_a_device = pytest.mark.skipif(
    gpu_device() is None, reason="needs a GPU build that sees a device (bash .ci/vulkan.sh on lavapipe)"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama with F32 matrices: llamafile's tinyBLAS takes its products of 2+ rows on the CPU."""
    return write_gguf(Spec("llama", mix=0.02, head=1.0), tmp_path_factory.mktemp("device-check") / "llama.gguf")


@pytest.mark.skipif(batch_invariant_build(), reason="this llama.cpp was built without llamafile's tinyBLAS")
def test_the_check_finds_where_the_cpus_float_kernels_part_from_one_token_passes(tiny: Path, opened) -> None:
    cpu = opened(tiny, gpu_layers=0)
    assert cpu.capabilities.exactness.prompt_rows == 1  # kernels.py: tinyBLAS from 2 rows
    assert identical_block_rows(cpu) == 1


def test_the_check_finds_every_block_size_identical_where_the_cpus_kernels_sum_as_one_token_passes(
    smollm2_q4_1: Path,
) -> None:
    cpu = LlamaCppBackend(str(smollm2_q4_1), n_ctx=256, gpu_layers=0)
    try:
        assert cpu.capabilities.exactness.rows is None  # kernels.py: Q4_1 verify blocks of any size
        assert identical_block_rows(cpu) == CHECKED_ROWS
        plain = runtime_for(cpu, strategy="none").generate(prompt=REPEATING, max_tokens=8, temperature=0).tokens
        cpu.rollback(0)
        assert identical_block_rows(cpu) == CHECKED_ROWS
        again = runtime_for(cpu, strategy="none").generate(prompt=REPEATING, max_tokens=8, temperature=0).tokens
        assert again == plain  # the check leaves the cache as it found it: empty
    finally:
        cpu.close()


def test_a_load_on_the_cpu_keeps_its_kernel_plan(tiny: Path, opened) -> None:
    cpu = opened(tiny, gpu_layers=0)
    assert cpu.capabilities.device == "cpu"
    assert cpu.capabilities.exactness == kernels_for(str(tiny), False, False, 1).exactness


def test_the_vulkan_argmax_is_kept_off_a_vocabulary_whose_rows_it_cannot_view() -> None:
    # ggml's Vulkan argmax aborts on a row view at an offset its device cannot bind (greedy.py).
    assert not rows_aligned(262, ("Vulkan",))
    assert rows_aligned(49_152, ("Vulkan",)) and rows_aligned(128_256, ("Vulkan",))
    assert rows_aligned(262, ("CUDA",)) and rows_aligned(262, ())


@on_a_device
def test_a_load_on_the_device_reports_the_block_sizes_its_check_found(tiny: Path, opened) -> None:
    target = opened(tiny, gpu_layers=99)
    known = target.capabilities.exactness
    assert target.capabilities.device == "gpu"
    assert known.cells is None and known.rows == known.prompt_rows == identical_block_rows(target)
    assert target.capabilities.extra["gpu"].split(" (")[0] in known.why


@on_a_device
@pytest.mark.parametrize("gamma", [1, 3, CHECKED_ROWS - 1])
def test_a_run_on_the_device_is_bit_exact_only_for_the_block_sizes_the_check_covered(
    tiny: Path, opened, gamma: int
) -> None:
    target = opened(tiny, gpu_layers=99)
    rows = target.capabilities.exactness.rows
    assert rows is not None
    plain = runtime_for(target, strategy="none").generate(prompt=REPEATING, max_tokens=40, temperature=0)
    target.rollback(0)
    spec = runtime_for(target, strategy="ngram", draft_tokens=gamma, calibrate=False).generate(
        prompt=REPEATING, max_tokens=40, temperature=0
    )
    assert spec.stats.drafted > 0
    block = max(spec.stats.gamma_histogram) + 1
    assert spec.stats.bit_exact == (block <= rows), (block, rows, spec.stats.inexact_reason)
    if block <= rows:
        assert spec.tokens == plain.tokens  # by construction there


@on_a_device
@pytest.mark.skipif("Vulkan" not in gpu_backends(), reason="the row alignment is ggml's Vulkan argmax's")
def test_a_tiny_vocabulary_verifies_on_the_vulkan_device_with_the_hosts_argmax(tiny: Path, opened) -> None:
    target = opened(tiny, gpu_layers=99)
    assert target.info.n_vocab * 4 % 256 != 0
    assert not target._greedy.wanted  # type: ignore[attr-defined]
    plain = runtime_for(target, strategy="none").generate(prompt=REPEATING, max_tokens=40, temperature=0)
    target.rollback(0)
    spec = runtime_for(target, strategy="ngram", draft_tokens=4, calibrate=False)
    assert spec.generate(prompt=REPEATING, max_tokens=40, temperature=0).tokens == plain.tokens


def test_doctor_names_the_drafts_a_device_check_covered() -> None:
    from localspec.cli.doctor import _bit_exact_line
    from localspec.core.protocol import Exactness

    why = "on llvmpipe a block of 3 tokens gave other logits than one-token passes (checked at load)"
    line = _bit_exact_line(Exactness(None, why, rows=2, prompt_rows=2))
    assert "drafts of up to 1 token;" in line and why in line
    assert "near-ties" in _bit_exact_line(Exactness(None, why, rows=1, prompt_rows=1))
    assert _bit_exact_line(Exactness(None, rows=64)).endswith("at any length")  # the CPU's split K-quants
