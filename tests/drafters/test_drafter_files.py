"""Drafters kept in files of their own that run inside their target's context (an MTP assistant,
an EAGLE-3 head, a DFlash drafter) attach through one protocol, localspec.drafters.DrafterHost;
a backend that runs a kind refuses the others, and one that runs none is refused by the API,
each refusal naming the backends that do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localspec.api import load_drafter
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.backends.reference import ReferenceBackend
from localspec.core.errors import InvalidRequestError
from localspec.drafters import DrafterHost, cannot_attach
from localspec.drafters.files import dflash_drafter
from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
from localspec.testing.gguf_writer import Gemma4Spec, Spec, write_gemma4_pair


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("drafter_files")
    _, assistant = write_gemma4_pair(Gemma4Spec(), folder)
    head = write_eagle3_gguf(Spec("llama"), HeadSpec(), folder / "eagle3-head.gguf")
    return {"assistant": assistant, "eagle3": head}


def test_the_llama_cpp_backend_hosts_every_drafter_file() -> None:
    assert issubclass(LlamaCppBackend, DrafterHost)


def test_a_backend_that_runs_none_is_refused_with_the_backends_that_do(files: dict[str, Path]) -> None:
    target = ReferenceBackend(seed=3, n_ctx=64)
    assert not isinstance(target, DrafterHost)
    with pytest.raises(
        InvalidRequestError, match=re.escape("is an EAGLE-3 head, which drafts on the llama.cpp backend only")
    ):
        load_drafter(target, str(files["eagle3"]), "reference", {})
    with pytest.raises(
        InvalidRequestError, match=re.escape("Gemma 4 assistant, which drafts on the llama.cpp and MLX backends")
    ):
        load_drafter(target, str(files["assistant"]), "reference", {})
    with pytest.raises(InvalidRequestError, match="the reference backend does not run DFlash drafters"):
        dflash_drafter(target, str(files["eagle3"]), None)


def test_each_refusal_says_what_to_use_instead() -> None:
    assert "--backend mlx" in (cannot_attach("assistant", "a.gguf", "torch").hint or "")
    assert "--backend llamacpp" in (cannot_attach("eagle3", "h.gguf", "mlx").hint or "")
