"""llama.cpp's sliding-window models (Gemma 3) keep their whole window cache: rolling back a
rejected draft needs the tokens a pruned window would have dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.mark.model
def test_the_backend_asks_llamacpp_for_the_full_sliding_window_cache(
    smollm2_q4_1: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llama_cpp
    from model_support import load_llamacpp

    seen: list[Any] = []
    real = llama_cpp.llama_init_from_model

    def spy(model: Any, params: Any) -> Any:
        seen.append(params.swa_full)
        return real(model, params)

    monkeypatch.setattr(llama_cpp, "llama_init_from_model", spy)
    load_llamacpp(smollm2_q4_1, n_ctx=256).close()
    assert seen == [True]
