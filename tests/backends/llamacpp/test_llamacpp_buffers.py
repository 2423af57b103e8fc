"""llama.cpp's extra weight buffers (repacked and AMX layouts) stay off where its AMX
kernels are compiled in, unless the user turns them on; flash attention is llama.cpp's own
choice unless told; the peers run with the same settings."""

from __future__ import annotations

import pytest

llamacpp = pytest.importorskip("localspec.backends.llamacpp.backend", reason="needs llama-cpp-python")


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


def test_flash_attention_is_llama_cpps_own_choice_unless_told(monkeypatch):
    monkeypatch.delenv("LLAMA_ARG_FLASH_ATTN", raising=False)
    assert llamacpp.flash_attention() == llamacpp.llama.LLAMA_FLASH_ATTN_TYPE_AUTO


@pytest.mark.parametrize("value", ["on", "off", "auto"])
def test_flash_attention_follows_llama_cpps_variable(monkeypatch, value):
    monkeypatch.setenv("LLAMA_ARG_FLASH_ATTN", value)
    assert llamacpp.flash_attention() == llamacpp.FLASH_ATTN[value]


def test_the_peers_run_with_the_same_settings(monkeypatch):
    from localspec.tooling.peers import peer_env

    monkeypatch.setenv("LLAMA_ARG_FLASH_ATTN", "off")
    monkeypatch.setenv("LLAMA_ARG_REPACK", "0")
    env = peer_env()
    assert env["LLAMA_ARG_FLASH_ATTN"] == "off" and env["LLAMA_ARG_REPACK"] == "0"
