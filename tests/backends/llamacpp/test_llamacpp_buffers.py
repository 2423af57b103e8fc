"""llama.cpp's extra weight buffers (repacked and AMX layouts) stay off where its AMX
kernels are compiled in for a model whose types its AMX tiles multiply, unless the user turns
them on; flash attention is llama.cpp's own choice unless told; the peers run with the same
settings, model file by model file."""

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


AMX_BUILD = b"AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1 |"
F16, Q4_1, Q4_K, F32 = 1, 3, 12, 0


def test_an_amx_build_keeps_them_off(monkeypatch):
    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    monkeypatch.setattr(llamacpp.llama, "llama_print_system_info", lambda: AMX_BUILD)
    assert llamacpp.extra_buffers() is False
    monkeypatch.setattr(llamacpp.llama, "llama_print_system_info", lambda: b"AVX2 = 1 | REPACK = 1 |")
    llamacpp.extra_buffers.cache_clear()
    assert llamacpp.extra_buffers() is True


def test_an_amx_build_keeps_them_for_a_model_its_amx_tiles_would_not_multiply(monkeypatch):
    # Its AMX buffer multiplies F16 with AVX-512 kernels alone; the tiles take the quantized types.
    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    monkeypatch.setattr(llamacpp.llama, "llama_print_system_info", lambda: AMX_BUILD)
    assert llamacpp.extra_buffers(frozenset({F16})) is True
    assert llamacpp.extra_buffers(frozenset({F32, F16})) is True
    assert llamacpp.extra_buffers(frozenset({Q4_1})) is False
    assert llamacpp.extra_buffers(frozenset({F16, Q4_K})) is False
    monkeypatch.setenv("LLAMA_ARG_REPACK", "0")
    llamacpp.extra_buffers.cache_clear()
    assert llamacpp.extra_buffers(frozenset({F16})) is False


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


def test_the_peers_get_the_setting_of_the_files_they_load(monkeypatch, tmp_path):
    """A peer's one setting covers every file it loads: on only where each file would have it."""
    from localspec.backends.llamacpp import kernels
    from localspec.testing.gguf_writer import Spec, write_gguf
    from localspec.tooling.peers import command_models, peer_env

    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    monkeypatch.setattr(llamacpp.llama, "llama_print_system_info", lambda: AMX_BUILD)
    half = str(write_gguf(Spec("llama", half=True), tmp_path / "half.gguf"))
    assert kernels.matrix_types(half) == {F16}
    quantized = tmp_path / "quantized.gguf"  # the types are all the setting reads
    monkeypatch.setattr(
        kernels, "matrix_types", lambda path: frozenset({Q4_1}) if path == str(quantized) else frozenset({F16})
    )
    assert peer_env(half)["LLAMA_ARG_REPACK"] == "1"
    assert peer_env(str(quantized))["LLAMA_ARG_REPACK"] == "0"
    cmd = ["llama-speculative-simple", "-m", half, "-p", "hi", "-md", str(quantized), "-n", "8"]
    assert command_models(cmd) == [half, str(quantized)]
    assert peer_env(*command_models(cmd))["LLAMA_ARG_REPACK"] == "0"
    assert peer_env()["LLAMA_ARG_REPACK"] == "0"  # no file named: as for any model


def test_a_peer_given_a_file_that_cannot_be_read_gets_the_setting_for_any_model(monkeypatch, tmp_path):
    from localspec.tooling.peers import peer_env

    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    monkeypatch.setattr(llamacpp.llama, "llama_print_system_info", lambda: AMX_BUILD)
    assert peer_env(str(tmp_path / "missing.gguf"))["LLAMA_ARG_REPACK"] == "0"


def test_a_block_drafters_file_loads_with_this_machines_setting(monkeypatch, tmp_path):
    """A DFlash or DSpark file loaded with llama.cpp's defaults went into the AMX buffer: a Q8_0
    drafter faulted on its first block pass on a VM that advertises AMX without running it."""
    from localspec.backends.llamacpp import dflash
    from localspec.core.errors import ModelLoadError
    from localspec.testing.dflash_support import write_dflash_gguf
    from localspec.testing.gguf_writer import Spec, write_gguf

    drafter = write_dflash_gguf(write_gguf(Spec("llama"), tmp_path / "t.gguf"), tmp_path / "dflash.gguf")
    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    monkeypatch.setattr(llamacpp.llama, "llama_print_system_info", lambda: AMX_BUILD)
    asked: list[bool] = []

    def load(path: bytes, mparams: object) -> None:
        asked.append(bool(mparams.use_extra_bufts))  # type: ignore[attr-defined]
        return None  # what llama.cpp gives for a file it cannot load

    monkeypatch.setattr(dflash.llama, "llama_model_load_from_file", load)
    with pytest.raises(ModelLoadError):
        dflash.load_dflash_model(str(drafter), 0)
    assert asked == [False]
