"""llama.cpp's extra weight buffers (repacked and AMX layouts) stay off where its AMX
kernels are compiled in, unless the user turns them on."""

from __future__ import annotations

import pytest

llamacpp = pytest.importorskip("localspec.backends.llamacpp", reason="needs llama-cpp-python")


@pytest.fixture(autouse=True)
def fresh_setting():
    llamacpp.extra_buffers.cache_clear()
    yield
    llamacpp.extra_buffers.cache_clear()


@pytest.mark.parametrize(("value", "expected"), [("0", False), ("1", True)])
def test_the_environment_decides_when_set(monkeypatch, value, expected):
    monkeypatch.setenv("LLAMA_ARG_REPACK", value)
    assert llamacpp.extra_buffers() is expected


def test_an_amx_build_keeps_them_off(monkeypatch):
    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    monkeypatch.setattr(llamacpp.llama, "llama_print_system_info", lambda: b"AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    assert llamacpp.extra_buffers() is False
    monkeypatch.setattr(llamacpp.llama, "llama_print_system_info", lambda: b"AVX2 = 1 | REPACK = 1 |")
    llamacpp.extra_buffers.cache_clear()
    assert llamacpp.extra_buffers() is True
