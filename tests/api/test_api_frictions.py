"""What an app developer meets first, as the openai and ollama clients have taught them: the
error types at the top level, fixes that name load()'s arguments (not the CLI's flags), a chat
passed positionally, max_tokens=None, a cancel Event left set, and generate(stream=True)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import localspec
from localspec.api import Runtime, load
from localspec.cli.main import main
from localspec.core import errors
from localspec.core.errors import LocalspecError, api_terms

CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    with load("reference:seed=0", backend="reference", calibrate=False, n_ctx=512) as rt:
        yield rt


@pytest.mark.parametrize(
    "name",
    [
        "ModelLoadError",
        "InvalidRequestError",
        "ContextFullError",
        "PairMismatchError",
        "BackendUnavailableError",
        "BackendClosedError",
        "NotPulledError",
        "PullError",
        "RuntimeBusyError",
        "LineFullError",
    ],
)
def test_every_error_type_is_importable_from_localspec_itself(name: str) -> None:
    error = getattr(localspec, name)
    assert issubclass(error, LocalspecError) and name in localspec.__all__


def test_a_load_error_names_loads_arguments_for_a_python_caller() -> None:
    with pytest.raises(localspec.InvalidRequestError) as refused:
        load("reference:seed=0", backend="reference", strategy="mtp")
    assert refused.value.hint == 'use backend="llamacpp" or backend="mlx" for strategy="mtp"'
    assert str(refused.value).endswith(refused.value.hint)


def test_the_same_error_names_the_flags_on_the_command_line(capsys) -> None:
    code = main(["run", "--backend", "reference", "-m", "reference:seed=0", "--strategy", "mtp", "hi"])
    assert code == 2 and "use --backend llamacpp or --backend mlx for --strategy mtp" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("cli", "api"),
    [
        ("pass --draft-model PATH (or draft_model=)", "pass draft_model=PATH"),
        ("use --ctx 4096 (the default), or leave it out", "use n_ctx=4096 (the default), or leave it out"),
        ("or pass --model PATH to a GGUF file you have", "or pass model=PATH to a GGUF file you have"),
        ("drop --exact, or drop --backend/--rpc/--gpu-layers", "drop exact=True, or drop backend=/rpc=/gpu_layers="),
        ("pick another --port (0: any free one)", "pick another --port (0: any free one)"),  # not a load() option
    ],
)
def test_fixes_translate_flag_by_flag(cli: str, api: str) -> None:
    assert api_terms(cli) == api


def test_no_cli_is_running_once_main_has_returned(capsys) -> None:
    main(["run", "--backend", "reference", "-m", "reference:seed=0", "--strategy", "mtp", "hi"])
    assert errors._cli_running == 0


def test_a_chat_given_positionally_is_answered_as_messages(runtime: Runtime) -> None:
    positional = runtime.generate(CHAT, max_tokens=5, temperature=0)
    keyword = runtime.generate(messages=CHAT, max_tokens=5, temperature=0)
    assert positional.text == keyword.text and positional.tokens == keyword.tokens


def test_a_chat_given_twice_is_refused(runtime: Runtime) -> None:
    with pytest.raises(localspec.InvalidRequestError, match="given twice"):
        runtime.generate(CHAT, messages=CHAT)


def test_max_tokens_none_runs_to_the_end_of_the_context(runtime: Runtime) -> None:
    out = runtime.generate("hello", max_tokens=None, temperature=0)  # type: ignore[arg-type]
    assert out.finish_reason in ("context_full", "stop")
    assert out.finish_reason == "stop" or len(out.tokens) > 256  # past the default cap


def test_a_cancel_event_already_set_warns_at_the_apps_line(runtime: Runtime) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.warns(RuntimeWarning, match="already set when the request started") as warned:
        out = runtime.generate("hi", cancel=cancel)
    assert out.finish_reason == "cancelled" and out.text == ""
    assert warned[0].filename == __file__


def test_a_cancel_that_is_not_an_event_is_refused(runtime: Runtime) -> None:
    with pytest.raises(localspec.InvalidRequestError, match=r"threading\.Event"):
        runtime.generate("hi", cancel=True)  # type: ignore[arg-type]


def test_generate_with_stream_true_points_at_stream(runtime: Runtime) -> None:
    with pytest.raises(localspec.InvalidRequestError) as refused:
        runtime.generate("hi", stream=True)
    assert "runtime.stream(" in (refused.value.hint or "")
