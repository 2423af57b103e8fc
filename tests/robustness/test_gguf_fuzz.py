"""Malformed GGUF headers get a ModelLoadError, never another exception or a hang (issue 33).
A fixed seed set here; benchmarks/fault_injection.py --gguf-cases runs more seeds."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from localspec.common.gguf_header import read_header
from localspec.core.errors import ModelLoadError
from localspec.testing.gguf_fuzz import KV, MUTATIONS, base_layout, encode, fuzz

CI_SEEDS = range(1400)  # 100 cases per mutation, about 3 s


def test_every_mutated_header_is_read_or_refused_with_a_model_load_error(tmp_path: Path) -> None:
    result = fuzz(CI_SEEDS, tmp_path)
    assert sum(result.tried.values()) == len(CI_SEEDS) and set(result.tried) == set(MUTATIONS)
    assert result.failures == []
    assert result.refused > len(CI_SEEDS) // 3  # the mutations do break headers


def header_with(tmp_path: Path, kv: KV | None = None, version: int = 3) -> Path:
    layout = base_layout(tmp_path)
    layout.version = version
    if kv is not None:
        layout.kvs = [k for k in layout.kvs if k.key != kv.key] + [kv]
    path = tmp_path / "case.gguf"
    path.write_bytes(encode(layout))
    return path


@pytest.mark.parametrize("value", [0, 3, 2**31 + 1])
def test_an_alignment_that_is_not_a_power_of_two_is_refused_by_name(tmp_path: Path, value: int) -> None:
    with pytest.raises(ModelLoadError, match=r"general\.alignment is .*not a power of two"):
        read_header(header_with(tmp_path, KV("general.alignment", 4, value)))


def test_arrays_nested_thousands_deep_are_refused_not_recursed(tmp_path: Path) -> None:
    layout = base_layout(tmp_path)
    nested = struct.pack("<IQ", 4, 0)
    for _ in range(5000):
        nested = struct.pack("<IQ", 9, 1) + nested
    data = encode(layout)
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    key = struct.pack("<Q", 4) + b"deep" + struct.pack("<I", 9)
    path = tmp_path / "deep.gguf"
    path.write_bytes(data[:8] + struct.pack("<QQ", n_tensors, n_kv + 1) + key + nested + data[24:])
    with pytest.raises(ModelLoadError, match="nested more than"):
        read_header(path)


def test_a_big_endian_gguf_is_named_as_one(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="big-endian"):
        read_header(header_with(tmp_path, version=0x03000000))


def test_a_tokenizer_whose_tokens_are_not_a_list_is_refused(tmp_path: Path) -> None:
    from localspec.common.gguf_header import gguf_vocab_identity

    with pytest.raises(ModelLoadError, match="damaged tokenizer"):
        gguf_vocab_identity(header_with(tmp_path, KV("tokenizer.ggml.tokens", 4, 7)))
