"""GGUF matrices converted into the layouts of torch's int4 / int8 weight-only kernels.

The GPU path's conversions run here on the CPU (CI has no GPU): each GGUF type's blocks,
written with random bytes so every bit of the layout is exercised, against the gguf
package's own dequantizer; the CPU twins of the CUDA kernels read the converted codes; a
converted model is cached by its file's hash; and an 8B-shape target fits the memory the
design card promises, computed from its shapes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch backend tests need PyTorch: pip install 'localspec[torch]'")
gguf = pytest.importorskip("gguf")

from test_torch_tiny_models import SMALL, TEXT_IDS, tiny  # noqa: E402

from localspec.backends.torch import converted, quantized  # noqa: E402
from localspec.backends.torch.linear import Int4, Int8  # noqa: E402
from localspec.backends.torch.quantized import Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0  # noqa: E402
from localspec.backends.torch.shapes import SHAPES  # noqa: E402
from localspec.testing.benchmarks import load_benchmark  # noqa: E402
from localspec.testing.gguf_writer import Spec  # noqa: E402

GiB = 1 << 30
# qtype -> (bytes per block, offsets of its float16 fields)
LAYOUT = {
    Q4_0: (18, [0]),
    Q4_1: (20, [0, 2]),
    Q8_0: (34, [0]),
    Q4_K: (144, [0, 2]),
    Q5_K: (176, [0, 2]),
    Q6_K: (210, [208]),
}
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}
ROWS, WIDTH = 24, 512


def random_blocks(qtype: int, seed: int = 0) -> np.ndarray:
    """[ROWS, bytes per row] of random blocks whose float16 scales are small positive numbers."""
    size, halves = LAYOUT[qtype]
    per_block = 256 if qtype in (Q4_K, Q5_K, Q6_K) else 32
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(ROWS, WIDTH // per_block * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    for at in halves:
        scales = rng.uniform(1e-3, 2e-2, len(blocks)).astype(np.float16)
        blocks[:, at : at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw


def file_values(raw: np.ndarray, qtype: int) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)), dtype=np.float32)


@pytest.mark.parametrize("qtype", [Q4_0, Q4_1, Q4_K], ids=NAMES.get)
def test_four_bit_gguf_types_carry_their_codes_and_scales_into_int4(qtype: int) -> None:
    raw = random_blocks(qtype)
    codes = quantized.convert(raw, qtype, ROWS, "int4")
    assert isinstance(codes, quantized.GroupCodes) and codes.group == 32
    expected = file_values(raw, qtype)
    got = codes.dequantized().numpy()
    if qtype == Q4_0:
        np.testing.assert_array_equal(got, expected)  # (q - 8)·d + 0: the very products
    else:
        # The zero (m + 8d, or 8·d·sc - dmin·m) is rounded once in float32.
        np.testing.assert_allclose(got, expected, rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(expected).max())


@pytest.mark.parametrize("qtype", [Q5_K, Q6_K, Q8_0], ids=NAMES.get)
def test_wider_gguf_types_are_requantized_into_int4_within_half_a_step(qtype: int) -> None:
    raw = random_blocks(qtype)
    codes = quantized.convert(raw, qtype, ROWS, "int4")
    assert isinstance(codes, quantized.GroupCodes)
    expected = file_values(raw, qtype)
    error = np.abs(codes.dequantized().numpy() - expected).reshape(ROWS, -1, 32)
    step = codes.scale.numpy()[..., None]
    assert (error <= step / 2 * (1 + 1e-5)).all()
    assert error.max() > 0  # 5, 6 and 8 bits do not fit in 4: not exact


@pytest.mark.parametrize("qtype", list(LAYOUT), ids=NAMES.get)
def test_every_gguf_type_is_requantized_into_int8_within_half_a_step(qtype: int) -> None:
    raw = random_blocks(qtype)
    codes = quantized.convert(raw, qtype, ROWS, "int8")
    assert isinstance(codes, quantized.RowCodes)
    expected = file_values(raw, qtype)
    error = np.abs(codes.dequantized().numpy() - expected)
    assert (error <= codes.scale.numpy()[:, None] / 2 * (1 + 1e-5)).all()
    # One scale a row cannot hold a scale per block of 32 values: never exact.
    assert error.max() > 0


@pytest.mark.parametrize("qtype", [Q4_0, Q4_K, Q6_K], ids=NAMES.get)
@pytest.mark.parametrize("rows", [1, 5])
def test_the_int4_kernel_reads_converted_codes_as_their_values(qtype: int, rows: int) -> None:
    codes = quantized.convert(random_blocks(qtype), qtype, ROWS, "int4")
    assert isinstance(codes, quantized.GroupCodes)
    x = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(1))
    layer = Int4(codes)  # one row: torch's packed CPU kernel; five: the widened codes
    torch.testing.assert_close(layer(x), x @ codes.dequantized().T, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 5])
def test_the_int8_kernel_reads_converted_codes_as_their_values(rows: int) -> None:
    codes = quantized.convert(random_blocks(Q8_0), Q8_0, ROWS, "int8")
    x = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(Int8(codes)(x), x @ codes.dequantized().T, rtol=1e-4, atol=1e-5)


def test_an_8b_int4_target_fits_in_6_gib_before_its_kv_cache() -> None:
    config, tied, _ = SHAPES["llama-3.1-8b"]
    # A Q4_K_M file: block matrices into int4, its Q6_K head into int8.
    int4 = quantized.model_bytes(config, "int4", tied, head=quantized.head_kind("int4", Q6_K))
    assert int4 <= 6 * GiB
    # The same shapes dense in bfloat16 are the ~16 GB no 8-12 GB card holds.
    assert quantized.model_bytes(config, "dense", tied) > 14 * GiB
    assert int4 < quantized.model_bytes(config, "int8", tied) < quantized.model_bytes(config, "dense", tied)


def test_the_shapes_have_their_models_parameter_counts() -> None:
    # Dense bf16 bytes / 2 = parameters (norms included), against the published sizes.
    published = {"llama-3.1-8b": 8.03e9, "llama-3.2-1b": 1.24e9, "qwen2.5-7b": 7.6e9, "qwen2.5-0.5b": 0.49e9}
    for name, params in published.items():
        config, tied, _ = SHAPES[name]
        assert quantized.model_bytes(config, "dense", tied) / 2 == pytest.approx(params, rel=0.02)


def test_a_converted_model_is_cached_by_its_files_hash(models, monkeypatch) -> None:
    path = str(models(SMALL))
    first = tiny(path, weights="int4")
    assert first.capabilities.extra["weights"] == "int4"
    entry = converted.entry(path, "int4")
    assert entry.exists()

    def no_conversion(*args: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(quantized, "convert", no_conversion)
    again = tiny(path, weights="int4")
    np.testing.assert_array_equal(again.eval_block(TEXT_IDS[:6], "all"), first.eval_block(TEXT_IDS[:6], "all"))


def test_a_head_of_more_than_4_bits_goes_into_int8_and_a_4_bit_one_stays_int4() -> None:
    assert quantized.head_kind("int4", Q6_K) == quantized.head_kind("int4", Q8_0) == "int8"
    assert quantized.head_kind("int4", Q4_K) == "int4"
    assert quantized.head_kind("int8", Q4_0) == "int8"


def test_an_int4_target_stays_close_to_its_dense_self_and_smaller(models) -> None:
    path = str(models(SMALL))
    dense, int4 = tiny(path, weights="dense"), tiny(path, weights="int4")
    assert int4.info.size_bytes < dense.info.size_bytes / 2  # its tied head keeps a dense embedding too
    a, b = dense.eval_block(TEXT_IDS[:12], "all"), int4.eval_block(TEXT_IDS[:12], "all")
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.95


@pytest.mark.parametrize("weights", ["int8", "int4", "dense"])
def test_a_bfloat16_model_feeds_its_blocks_bfloat16_whatever_its_tables_layout(models, weights: str) -> None:
    # A tied int8 head read by rows gives float32; CUDA's graphed cache write (index_copy_)
    # and fused attention refuse a float32 row next to a bfloat16 cache (seen on an H200).
    for spec in (SMALL, Spec("gemma3")):
        backend = tiny(str(models(spec)), dtype="bfloat16", weights=weights)
        assert backend.model.embedding(torch.tensor([1, 2, 3])).dtype == torch.bfloat16


def test_unknown_weight_layouts_are_refused_with_the_choices(models) -> None:
    from localspec.core.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="int4"):
        tiny(str(models(SMALL)), weights="int3")


@pytest.mark.model
def test_the_default_q4_1_model_runs_as_int4_on_the_cpu_when_asked(smollm2_q4_1: Path) -> None:
    from localspec.backends.torch import TorchBackend

    dense = TorchBackend(str(smollm2_q4_1), n_ctx=64, device="cpu")
    int4 = TorchBackend(str(smollm2_q4_1), n_ctx=64, device="cpu", weights="int4")
    tokens = dense.tokenize("The capital of France is Paris, and the capital of", add_special=True, parse_special=False)
    a, b = dense.eval_block(tokens, "all"), int4.eval_block(tokens, "all")
    # Every block's Q4_1 matrix is carried over exactly; only the tied Q8_0 head is re-quantized.
    assert np.mean(a.argmax(1) == b.argmax(1)) >= 0.8


def test_the_gpu_shapes_benchmark_runs_on_the_cpu_with_tiny_shapes(capsys, tmp_path: Path) -> None:
    gpu_shapes = load_benchmark("gpu_shapes")

    threads = torch.get_num_threads()
    try:
        gpu_shapes.main(["--tiny", "--reps", "1", "--kinds", "int4,bf16", "--n-ctx", "64"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "t(k)/t(1)" in out and "adaptive γ" in out
    assert out.count("tiny <- tiny") == 2 * len(gpu_shapes.ALPHAS)
    # A saved run (a GPU's, cut short say) gives its projections back without a GPU: the same
    # rows, with speedups from the table's rounded costs.
    saved = tmp_path / "run.txt"
    saved.write_text(out)
    gpu_shapes.main(["--project", str(saved)])
    projected = capsys.readouterr().out

    def rows(text: str) -> dict[tuple[str, str], float]:
        found = [line.split() for line in text.splitlines() if "tiny <- tiny" in line]
        return {(f[3], f[4]): float(f[6].rstrip("x")) for f in found}

    assert rows(projected).keys() == rows(out).keys()
    assert all(abs(rows(projected)[k] - speed) < 0.05 for k, speed in rows(out).items())
