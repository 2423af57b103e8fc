"""Self-drafting on the real model: qspec and layerskip are exact, and their choice is cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.api import load, runtime_for
from localspec.backends.llamacpp import copies
from localspec.backends.llamacpp.copies import QSPEC_TYPES
from localspec.control.prompts import SUITE
from localspec.core.errors import InvalidRequestError
from localspec.testing.gguf_writer import Spec, write_gguf

pytestmark = pytest.mark.model


@pytest.mark.parametrize("strategy", ["qspec:Q4_0", "layerskip:20"])
@pytest.mark.parametrize("gamma", [2, 5])
def test_self_drafting_is_token_identical_to_plain_greedy_decoding(
    smollm2_q4_1: Path, strategy: str, gamma: int, session_home: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("LOCALSPEC_HOME", str(session_home))  # each draft length reuses the drafter's copy
    messages = SUITE[0].messages
    with load(str(smollm2_q4_1), strategy=strategy, draft_tokens=gamma, n_ctx=1024) as rt:
        plain = runtime_for(rt.target, strategy="none", calibrate=False).generate(
            messages=messages, max_tokens=40, temperature=0
        )
        spec = rt.generate(messages=messages, max_tokens=40, temperature=0)
        assert spec.stats.strategy == strategy
        assert spec.stats.drafted > 0
        assert spec.tokens == plain.tokens


def test_layerskip_drafter_keeps_the_requested_number_of_blocks(smollm2_q4_1: Path) -> None:
    with load(str(smollm2_q4_1), strategy="layerskip:12", draft_tokens=2, n_ctx=512) as rt:
        assert rt.draft is not None
        assert rt.draft.info.n_layers == 12
        assert rt.target.info.n_layers == 30


def test_an_automatic_choice_is_remembered_for_the_next_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Half of the candidates make a choice to remember at half of the quantizing and timing,
    # on a tiny random llama: choosing and remembering are the same for any GGUF, and each
    # candidate is quantized, compared and timed with the target's cost curve.
    monkeypatch.setattr(copies, "QSPEC_TYPES", QSPEC_TYPES[::2])
    model = str(write_gguf(Spec("llama"), tmp_path / "tiny.gguf"))
    with load(model, strategy="qspec", n_ctx=256) as first:
        label = first.label
    assert label.split(":")[1] in QSPEC_TYPES[::2]
    with load(model, strategy="qspec", n_ctx=256) as second:
        assert second.label == label


@pytest.mark.parametrize(
    ("strategy", "message"),
    [("qspec:Q9", "unknown low-bit type"), ("layerskip:0", "must keep between 1 and 29"), ("layerskip:x", "number")],
)
def test_bad_self_drafting_options_are_refused(smollm2_q4_1: Path, strategy: str, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        load(str(smollm2_q4_1), strategy=strategy, n_ctx=512)
