"""Issue 47's hostile inputs: a chat template that loops without printing, a hub that
trickles, a read-only or odd user directory, GGUFs of a newer version or cut short,
symlink loops, a models.toml nested 100,000 deep. Each CLI case runs the real `localspec`
in a child with a bound, so a hang fails the test instead of stalling the suite, and
checks the message names the fix and no traceback is printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_writer import Spec, write_gguf

import localspec.core.templates as templates
from localspec.core.errors import InvalidRequestError
from localspec.core.templates import render_chat

CHILD_BOUND_SECONDS = 120  # a bound, not a timing: each refusal comes in a few seconds
CHAT = [{"role": "user", "content": "hi"}]

# Nested loops of 10^10 turns that print nothing: a render without a step budget never ends.
LOOPING_TEMPLATE = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


def localspec_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localspec", *args],
        capture_output=True,
        text=True,
        timeout=CHILD_BOUND_SECONDS,
        env=env,
    )


def assert_clean_refusal(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in done.stderr, (word, done.stderr)


# -- chat templates ---------------------------------------------------------------------------


def test_a_template_that_loops_without_printing_is_stopped_naming_its_file() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        render_chat(LOOPING_TEMPLATE, CHAT, {}, source="/models/bad.gguf")
    assert "chat template in /models/bad.gguf was stopped" in caught.value.message
    assert caught.value.hint and "--raw" in caught.value.hint


def test_a_macro_that_calls_itself_twice_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(templates, "MAX_TEMPLATE_STEPS", 10_000)  # 2^60 calls, each one step
    bomb = "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}"
    with pytest.raises(InvalidRequestError, match="10,000 steps"):
        render_chat(bomb, CHAT, {})


def test_a_loop_over_a_list_it_built_is_counted_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(templates, "MAX_TEMPLATE_STEPS", 10_000)
    nested = "{% set xs = range(1000)|list %}{% for a in xs %}{% for b in xs %}{% endfor %}{% endfor %}"
    with pytest.raises(InvalidRequestError, match="was stopped"):
        render_chat(nested, CHAT, {})


def test_slow_steps_are_stopped_by_the_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(templates, "MAX_TEMPLATE_SECONDS", 0.0)  # the first check finds it spent
    with pytest.raises(InvalidRequestError, match="ran past 0 s"):
        render_chat("{% for a in range(1000) %}{% endfor %}", CHAT, {})


def test_counting_keeps_what_loops_mean() -> None:
    template = (
        "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ m.content }}{% if loop.last %}.{% endif %}"
        "{% endfor %}{% for k, v in {'a': 1}.items() %}{{ k }}{{ v }}{% endfor %}"
        "{% for x in nothing %}x{% else %}empty{% endfor %}"
    )
    assert render_chat(template, CHAT * 3, {}) == "1/3hi2/3hi3/3hi.a1empty"


@pytest.mark.usefixtures("smollm2_q4_1")  # the CLI needs llama-cpp-python to load the model
def test_run_with_a_looping_template_ends_naming_the_file(tmp_path: Path) -> None:
    model = write_gguf(Spec("llama", chat_template=LOOPING_TEMPLATE), tmp_path / "loops.gguf")
    done = localspec_cli("run", "-m", str(model), "hi")
    assert_clean_refusal(done, f"the chat template in {model} was stopped", "--raw")


# -- the user directory -----------------------------------------------------------------------


def home_env(home: Path | str) -> dict[str, str]:
    return {**os.environ, "LOCALSPEC_HOME": str(home)}


def read_only_prefix(folder: Path) -> list[str]:
    """A command prefix under which folder is read-only: chmod for a plain user; as root
    (whom chmod does not stop) a read-only bind mount in a user namespace of its own."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return []
    mount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", mount, str(folder), "sh", "-c", '! touch "$0"/x', str(folder)]
    )
    if probe.returncode != 0:
        pytest.skip("no way to make a read-only folder here (root without unshare)")
    return ["unshare", "-rm", "sh", "-c", mount, str(folder)]


@pytest.mark.parametrize("models_folder", [False, True], ids=["empty-home", "home-with-models-folder"])
def test_run_without_the_default_model_in_a_read_only_home_says_so(tmp_path: Path, models_folder: bool) -> None:
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True) if models_folder else home.mkdir()
    prefix = read_only_prefix(home)
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "localspec", "run", "hi"],
        capture_output=True,
        text=True,
        timeout=CHILD_BOUND_SECONDS,
        env=home_env(home),
    )
    where = home / "models" if models_folder else home
    assert_clean_refusal(done, f"{where} is read-only here", "set LOCALSPEC_HOME to a folder you can write")
    assert "fetching the default model" not in done.stderr


@pytest.mark.parametrize("home", ["/dev/null", "a-file", "/dev/null/below"])
def test_a_home_that_cannot_be_a_folder_is_refused_as_such(tmp_path: Path, home: str) -> None:
    if home == "a-file":
        home = str(tmp_path / "a-file")
        Path(home).write_text("not a folder")
    done = localspec_cli("list", env=home_env(home))
    assert_clean_refusal(done, f"LOCALSPEC_HOME {home}", "set LOCALSPEC_HOME to a folder you can write")
    assert "File exists" not in done.stderr


def test_a_home_others_can_write_is_used_with_a_warning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    done = localspec_cli("list", env=home_env(home))
    assert done.returncode == 0, done.stderr
    assert f"the user directory {home} can be written by other users (mode 777)" in done.stderr
    assert f"chmod go-w {home}" in done.stderr


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root can give a file away")
def test_a_registry_owned_by_another_user_is_used_with_a_warning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    registry = home / "models.toml"
    registry.write_text("")
    os.chown(registry, 4321, 4321)
    done = localspec_cli("list", env=home_env(home))
    assert done.returncode == 0, done.stderr
    assert f"the registry {registry} belongs to user 4321, not you" in done.stderr


def test_a_private_home_gets_no_warning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "models.toml").write_text("")
    done = localspec_cli("list", env=home_env(home))
    assert done.returncode == 0 and "note:" not in done.stderr, done.stderr


def test_a_models_toml_nested_100000_deep_is_refused_without_a_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "models.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    done = localspec_cli("list", env=home_env(home))
    assert_clean_refusal(done, "models.toml: its arrays or tables nest too deeply to read")
