"""Self-drafters (qspec, layerskip) loaded as a user loads them, on every backend that has them:
by name, at the default draft length, with the calibration on. The tests beside this file fix
the draft length and turn the calibration off to exercise acceptance; this one is the path
`localspec run --strategy qspec` takes, where Gemma 4's assistant once crashed (issue 44)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import localspec
from localspec.control import calibrate
from localspec.control.policy import AdaptiveDraftLength
from localspec.testing.gguf_writer import Spec

# Close to a bigram model: a copy with blocks left out, or at fewer bits, mostly agrees.
TARGET = Spec("llama", layers=4, mix=0.2)
PROMPT = "the sand and the"

CASES = [
    ("llamacpp", "qspec:Q4_0", "qspec:Q4_0"),
    ("llamacpp", "layerskip:2", "layerskip:2"),
    ("torch", "qspec:int4", "qspec:int4"),
    ("torch", "layerskip:2", "layerskip:2"),
    ("mlx", "qspec:4", "qspec:4"),
    ("mlx", "layerskip:2", "layerskip:2"),
]


@pytest.mark.parametrize(("backend", "strategy", "label"), CASES, ids=[f"{b}-{s}" for b, s, _ in CASES])
def test_a_self_drafter_by_name_at_the_default_length_answers_as_plain_decoding(
    models: Callable[[object], Path], backend: str, strategy: str, label: str
) -> None:
    pytest.importorskip({"llamacpp": "llama_cpp", "torch": "torch", "mlx": "mlx.core"}[backend])
    path = str(models(TARGET))
    options = {"n_ctx": 256, "backend": backend, **({"threads": 1} if backend == "llamacpp" else {})}
    with localspec.load(model=path, strategy="none", **options) as plain:
        expected = plain.generate(prompt=PROMPT, max_tokens=40, temperature=0)
    with localspec.load(model=path, strategy=strategy, **options) as runtime:
        assert runtime.label == label and runtime.draft is not None
        policy = runtime.policy
        assert isinstance(policy, AdaptiveDraftLength)  # the default: "auto", calibrated
        assert policy.prior == calibrate.pair_agreement(runtime.target, runtime.draft)
        spec = runtime.generate(prompt=PROMPT, max_tokens=40, temperature=0)
        again = runtime.generate(prompt=PROMPT, max_tokens=40, temperature=0)  # the curve learnt since
    assert spec.tokens == expected.tokens
    assert again.tokens == expected.tokens
