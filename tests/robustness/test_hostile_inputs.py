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

import localspec.common.templates as templates
from localspec.common.templates import render_chat
from localspec.core.errors import InvalidRequestError
from localspec.testing.gguf_writer import Spec, write_gguf

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
    assert f"the user directory {home} can be written by any user (mode 777)" in done.stderr
    assert f"chmod o-w {home}" in done.stderr


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


def test_a_home_only_its_group_can_write_gets_no_warning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o770)  # group-writable: a umask 002 system's normal
    (home / "models.toml").write_text("")
    done = localspec_cli("list", env=home_env(home))
    assert done.returncode == 0 and "note:" not in done.stderr, done.stderr


def test_a_models_toml_nested_100000_deep_is_refused_without_a_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "models.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    done = localspec_cli("list", env=home_env(home))
    assert_clean_refusal(done, "models.toml: its arrays or tables nest too deeply to read")


# -- model files: newer versions, cut downloads, symlink loops ---------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(Spec("llama"), tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def newer_version(model: Path, folder: Path) -> Path:
    data = model.read_bytes()
    path = folder / "v99.gguf"
    path.write_bytes(data[:4] + (99).to_bytes(4, "little") + data[8:])
    return path


def symlink_loop(folder: Path, name: str) -> Path:
    a, b = folder / name, folder / f"{name}-back"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


def test_a_newer_gguf_version_asks_for_a_newer_localspec(tiny_model: Path, tmp_path: Path) -> None:
    from localspec.common.gguf_header import diagnose_gguf, read_header
    from localspec.core.errors import ModelLoadError

    path = newer_version(tiny_model, tmp_path)
    with pytest.raises(ModelLoadError) as caught:
        read_header(path)
    assert "GGUF version 99, newer than" in caught.value.message
    assert caught.value.hint and "pip install -U localspec llama-cpp-python" in caught.value.hint
    assert "truncated or damaged" not in diagnose_gguf(str(path)) and "newer" in diagnose_gguf(str(path))


@pytest.mark.usefixtures("smollm2_q4_1")  # the CLI needs llama-cpp-python to load the model
def test_run_on_a_newer_gguf_version_says_upgrade(tiny_model: Path, tmp_path: Path) -> None:
    done = localspec_cli("run", "-m", str(newer_version(tiny_model, tmp_path)), "hi")
    assert_clean_refusal(done, "GGUF version 99, newer than", "-> upgrade localspec and llama.cpp: pip install -U")
    assert "truncated or damaged" not in done.stderr and "download" not in done.stderr


@pytest.mark.parametrize("name", ["loopA", "loopC.gguf"])
def test_add_with_a_symlink_loop_says_it_is_one(tmp_path: Path, name: str) -> None:
    loop = symlink_loop(tmp_path, name)
    done = localspec_cli("add", "mine", "--target", str(loop))
    assert_clean_refusal(done, f"{loop} is a symlink loop", "point to the .gguf file itself")


@pytest.mark.parametrize("name", ["loopA", "loopC.gguf"])
def test_run_with_a_symlink_loop_as_model_says_it_is_one_not_an_unknown_pair(tmp_path: Path, name: str) -> None:
    symlink_loop(tmp_path, name)
    done = subprocess.run(
        [sys.executable, "-m", "localspec", "run", "--model", f"./{name}", "hi"],
        capture_output=True,
        text=True,
        timeout=CHILD_BOUND_SECONDS,
        cwd=tmp_path,
    )
    assert_clean_refusal(done, f"./{name} is a symlink loop")
    assert "no pair named" not in done.stderr


def test_add_refuses_a_truncated_gguf_at_once(tiny_model: Path, tmp_path: Path, temporary_localspec_home: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model.read_bytes()[: tiny_model.stat().st_size // 2])
    done = localspec_cli("add", "mine", "--target", str(cut))
    assert_clean_refusal(done, f"{cut} is truncated: its tensors need", "download the file again")
    assert not (temporary_localspec_home / "models.toml").exists()


def test_add_takes_a_whole_gguf_through_a_symlink(tiny_model: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.gguf"
    link.symlink_to(tiny_model)
    done = localspec_cli("add", "mine", "--target", str(link))
    assert done.returncode == 0, done.stderr
