"""A registry pair handed to a serving engine with that engine's own speculative decoding:
vLLM and SGLang load the pair's safetensors repos (its `torch` or `safetensors` entries), llama-server the
pulled GGUF files. The result is a command to run, plus notes where the engine is known to
refuse the pair or cannot express what localspec does (an adaptive draft length).
An MTP pair gets each engine's own MTP settings: the target's head for Qwen3.5/3.6; for Gemma
4, its assistant: on llama-server the GGUF (the mtp-*.gguf sidecar pulled beside the target,
or the pair's drafter file), on vLLM the assistant's safetensors repo.
A pair with a vision projector takes images on each engine: llama-server its `--mmproj`,
vLLM and SGLang their switches for the checkpoint's own vision tower.

Flag and field names follow each engine's documentation; tests/models/test_export.py keeps them
with their sources.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from localspec.core.errors import LocalspecError
from localspec.models.entries import HubArtifact, Model, Pair, sidecar_of
from localspec.strategies import TABLE

ENGINES = ("vllm", "sglang", "llama-server")
HOST = "127.0.0.1"  # as localspec's own servers: reachable from this machine only
FIXED_DRAFT_TOKENS = 4  # what a fixed-length engine gets for a pair whose draft length is "auto"
# An MTP head's drafts lose acceptance faster with depth: llama.cpp's and SGLang's MTP
# examples draft 3 (vLLM's docs start from 1).
FIXED_MTP_DRAFT_TOKENS = 3
# A DFlash drafter proposes its trained block (16: anchor and 15 guesses) in one pass: the
# engines' DFlash examples verify all 15.
FIXED_DFLASH_DRAFT_TOKENS = 15
# A DSpark drafter's anchor row guesses too (DeepSpec's layout), so a block of 16 guesses 16;
# llama.cpp clamps --spec-draft-n-max to the drafter's trained block (docs/speculative.md).
FIXED_DSPARK_DRAFT_TOKENS = 16
# Where llama.cpp's draft-dspark is documented, and that the other engines document none.
DSPARK_ENGINES = ("llama-server",)
# The n-gram sizes vLLM tries, longest first: localspec also copies the longest earlier match.
PROMPT_LOOKUP_MAX = 5
PROMPT_LOOKUP_MIN = 2
LLAMA_SERVER_P_MIN = 0.0  # draft every position up to n-max: the engine's current default
# Images as localspec takes them: as many as the context holds (vLLM's own default count,
# vllm/config/multimodal.py), no video. vLLM: --limit-mm-per-prompt JSON (MultiModalConfig.
# limit_per_prompt); SGLang: --enable-multimodal, which some models (Gemma 4 among them) need
# and which "nothing will happen" for a model that is not multimodal (its server_args.py).
VLLM_IMAGE_LIMITS = {"image": 999, "video": 0}
SGLANG_VISION = ("--enable-multimodal",)

# Rows of the embedding (config.json vocab_size) of repos whose pairs an engine refuses;
# vLLM and SGLang require the drafter's to equal the target's, padding included.
KNOWN_VOCAB_ROWS = {
    "Qwen/Qwen2.5-0.5B-Instruct": 151936,
    "Qwen/Qwen2.5-7B-Instruct": 152064,
    "Qwen/Qwen2.5-Coder-0.5B-Instruct": 151936,
    "Qwen/Qwen2.5-Coder-7B-Instruct": 152064,
    "google/gemma-3-1b-it": 262144,
    "google/gemma-3-12b-it": 262208,
}

GgufResolver = Callable[[Pair], tuple[Path, Path | None]]


class ExportError(LocalspecError):
    """A pair that cannot be written as a command for the chosen engine."""


@dataclass(frozen=True)
class Export:
    engine: str
    argv: tuple[str, ...]
    notes: tuple[str, ...]  # refusals and approximations, shown as shell comments

    def script(self) -> str:
        """The notes as comments, then the command, one flag per line."""
        lines = [f"# {note}" for note in self.notes]
        i = next((j for j, a in enumerate(self.argv) if a.startswith("-")), len(self.argv))
        parts = [shlex.join(self.argv[:i])]
        while i < len(self.argv):  # keep each flag beside its value
            chunk = [self.argv[i]]
            if self.argv[i].startswith("-") and i + 1 < len(self.argv) and not self.argv[i + 1].startswith("-"):
                chunk.append(self.argv[i + 1])
            parts.append(" ".join(shlex.quote(c) for c in chunk))
            i += len(chunk)
        return "\n".join([*lines, " \\\n  ".join(parts)])


def export_pair(
    pair: Pair,
    engine: str,
    draft_tokens: int | None = None,
    strategy: str | None = None,
    ggufs: GgufResolver | None = None,
) -> Export:
    """The command serving `pair` on `engine` with speculation. strategy (default: the
    pair's, or "mtp" for a pair whose target ships an MTP assistant) is "draft", "ngram",
    "mtp", "dflash", "dspark" or "eagle3"; ggufs finds the pulled GGUF files for llama-server.
    A pair with a vision projector gets each engine's image settings (_with_vision)."""
    return _with_vision(_export(pair, engine, draft_tokens, strategy, ggufs), pair, ggufs)


def _export(
    pair: Pair, engine: str, draft_tokens: int | None, strategy: str | None, ggufs: GgufResolver | None
) -> Export:
    if engine not in ENGINES:
        raise ExportError(f"unknown engine {engine!r}", f"choose one of: {', '.join(ENGINES)}")
    notes: list[str] = []
    method = _method(pair, strategy, notes)
    if method == "dspark" and engine not in DSPARK_ENGINES:
        raise ExportError(
            f"{engine} documents no DSpark method (llama.cpp's draft-dspark is the only engine spelling)",
            "export it --to llama-server, or with --strategy ngram",
        )
    if method == "eagle3":
        return _export_eagle3(pair, engine, draft_tokens, ggufs, notes)
    if engine == "llama-server":
        return _export_llama_server(pair, method, draft_tokens, ggufs or _pulled_ggufs, notes)
    assistant_repo = _assistant_repo(pair) if method == "mtp" and _has_assistant(pair) else None
    if method == "mtp" and _has_assistant(pair) and assistant_repo is None:
        where = "--to llama-server"
        notes.append(
            f"the MTP assistant of {pair.target.name} is exported for {where} only"
            + (" (models.toml gives no safetensors repo for it)" if assistant_repo is None else "")
            + f"; {engine} gets n-gram lookup instead"
        )
        method = "ngram"
    if method == "dflash" and engine == "sglang":
        notes.append("SGLang's DFLASH verifies the drafter's whole trained block; localspec only the part that pays")
        k = 0  # SGLang takes no draft length for DFLASH
    else:
        k = draft_tokens if draft_tokens is not None else _fixed_draft_tokens(pair, engine, method, notes)
    target_repo = _torch_repo(pair.target, engine)
    drafter_repo = _torch_repo(pair.drafter, engine) if method in ("draft", "dflash") and pair.drafter else None
    if drafter_repo and method == "draft":
        notes += _vocab_refusal(engine, target_repo, drafter_repo)
    if method == "dflash":
        assert drafter_repo is not None
        return Export(engine, _dflash(engine, target_repo, drafter_repo, k), tuple(notes))
    if engine == "vllm":
        return Export(engine, _vllm(target_repo, method, drafter_repo or assistant_repo, k), tuple(notes))
    if method == "mtp":
        return Export(engine, _sglang_mtp(target_repo, k, assistant_repo), tuple(notes))
    if method == "ngram":
        notes.append("SGLang runs NGRAM speculation on CUDA GPUs only")
    return Export(engine, _sglang(target_repo, drafter_repo, k), tuple(notes))


def _export_llama_server(
    pair: Pair, method: str, draft_tokens: int | None, ggufs: GgufResolver, notes: list[str]
) -> Export:
    """llama-server's command for the pair's pulled GGUFs (ggufs finds them)."""
    engine = "llama-server"
    target, drafter = ggufs(pair)
    if method == "draft" and drafter is not None and _is_assistant_file(drafter):
        method = "mtp"  # an assistant drafts only as MTP (an entry written before `add` knew it)
    if method == "draft" and drafter is not None and _architecture(drafter) == "eagle3":
        method = "eagle3"  # likewise an EAGLE-3 head (an entry written before `add` knew them)
    k = draft_tokens if draft_tokens is not None else _fixed_draft_tokens(pair, engine, method, notes)
    if method == "eagle3":
        assert drafter is not None
        return Export(engine, _llama_server_eagle3(target, drafter, k), tuple(notes))
    if method == "mtp":
        assistant = _sidecar_path(pair, target) or drafter
        return Export(engine, _llama_server_mtp(target, assistant, k), tuple(notes))
    if method in ("dflash", "dspark"):
        assert drafter is not None  # a dflash or dspark pair has a drafter (registry)
        return Export(engine, _llama_server_dflash(target, drafter, k, f"draft-{method}"), tuple(notes))
    return Export(engine, _llama_server(target, drafter if method == "draft" else None, k), tuple(notes))


def _with_vision(export: Export, pair: Pair, ggufs: GgufResolver | None) -> Export:
    """The command of a pair with a vision projector, taking images as localspec does (no
    video or audio): llama-server its pulled projector; vLLM and SGLang read the projector
    from the target's own checkpoint, so they get their switches for it."""
    if pair.mmproj is None:
        return export
    if export.engine == "llama-server":
        return _with_projector(export, pair, ggufs)
    if export.engine == "sglang":
        return Export(export.engine, (*export.argv, *SGLANG_VISION), export.notes)
    if _vllm_drafts_with_a_model(export.argv):
        note = (
            "vLLM refuses a separate draft model, parallel drafting or an MTP assistant beside a multimodal "
            "target (vllm#33458, vllm#42005): exported with --language-model-only, text only. For images on vLLM "
            "export --strategy ngram (or the target's own MTP head, or EAGLE-3), or use --to llama-server"
        )
        return Export(export.engine, (*export.argv, "--language-model-only"), (*export.notes, note))
    limits = json.dumps(VLLM_IMAGE_LIMITS)
    return Export(export.engine, (*export.argv, "--limit-mm-per-prompt", limits), export.notes)


def _vllm_drafts_with_a_model(argv: tuple[str, ...]) -> bool:
    """Whether vLLM's speculative config drafts with a model of its own beside the target's
    layers: a draft model, DFlash (a parallel drafter) or an MTP assistant (Gemma 4's)."""
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    method = config.get("method")
    return method in ("draft_model", "dflash") or (method == "mtp" and "model" in config)


def _with_projector(export: Export, pair: Pair, ggufs: GgufResolver | None) -> Export:
    """llama-server's command with the pair's pulled vision projector (`--mmproj FILE`, as
    llama.cpp's common/arg.cpp spells it), so that its chats may hold images as localspec's do;
    none where the pull found the repo without it."""
    from localspec.models.pull import resolve_pair

    projector = resolve_pair(pair.id, backend="llamacpp").mmproj if ggufs is None else _projector_beside(pair, ggufs)
    if projector is None:
        return export
    return Export(export.engine, (*export.argv, "--mmproj", str(projector)), export.notes)


def _method(pair: Pair, strategy: str | None, notes: list[str]) -> str:
    """The engines' method for the strategy asked for (default: the pair's, or the MTP
    drafter a pair has unless it keeps a DFlash drafter), by the strategy table's row."""
    kept = _exported_as(pair.strategy)
    chosen = strategy or ("mtp" if pair.mtp is not None and kept not in ("dflash", "dspark") else pair.strategy)
    row = TABLE.get(chosen.partition(":")[0])
    method = row.exports_as if row is not None else "ngram"
    if method == "auto":
        method = "draft" if pair.drafter is not None else "ngram"
    if method == "draft" and pair.drafter is None:
        raise ExportError(f"pair {pair.id!r} has no drafter model", "export it with --strategy ngram")
    if method == "mtp" and pair.mtp is None:
        raise ExportError(
            f"pair {pair.id!r} has no MTP drafter (strategy mtp, or an mtp-*.gguf beside its target)",
            "export it with --strategy ngram" + (" or draft" if pair.drafter is not None else ""),
        )
    if method == "dflash" and kept != "dflash":
        raise ExportError(f"pair {pair.id!r} has no DFlash drafter", "export it with its strategy, or --strategy ngram")
    if method == "dspark" and kept != "dspark":
        raise ExportError(f"pair {pair.id!r} has no DSpark drafter", "export it with its strategy, or --strategy ngram")
    if row is None or (method == "ngram" and row.source != "lookup" and not row.chooses):
        notes.append(f"no engine has localspec's {chosen!r}: exported as n-gram lookup instead")
    return method


def _exported_as(strategy: str) -> str:
    """What the engines run a strategy as (its row's exports_as)."""
    row = TABLE.get(strategy.partition(":")[0])
    return row.exports_as if row is not None else "ngram"


def _fixed_draft_tokens(pair: Pair, engine: str, method: str, notes: list[str]) -> int:
    if pair.draft_tokens != "auto":
        return pair.draft_tokens
    fixed = {
        "mtp": FIXED_MTP_DRAFT_TOKENS,
        "eagle3": FIXED_MTP_DRAFT_TOKENS,  # EAGLE-3 and MTP: one-block heads
        "dflash": FIXED_DFLASH_DRAFT_TOKENS,
        "dspark": FIXED_DSPARK_DRAFT_TOKENS,
    }.get(method, FIXED_DRAFT_TOKENS)
    notes.append(
        f"localspec adapts the draft length to the machine and the text; {engine} takes a fixed one: "
        f"{fixed} (change it with --draft-tokens)"
    )
    return fixed


def _torch_repo(model: Model | None, engine: str) -> str:
    assert model is not None
    artifact = model.artifacts.get("torch") or model.safetensors
    if not isinstance(artifact, HubArtifact):
        raise ExportError(
            f"{model.name} has no safetensors repo (a `torch` or `safetensors` entry in models.toml), "
            f"which {engine} loads",
            "add one to the model's entry, or use --to llama-server",
        )
    return artifact.repo


def _has_assistant(pair: Pair) -> bool:
    """Whether an MTP pair drafts with an assistant (Gemma 4's), not the target's own head:
    a sidecar beside the target's GGUF, or a drafter model."""
    return sidecar_of(pair.target) is not None or pair.drafter is not None


def _assistant_repo(pair: Pair) -> str | None:
    """The assistant's safetensors repo, which vLLM takes as the MTP method's model: the
    pair's drafter's, or for a sidecar pair the registry's `<target id>-assistant` model's."""
    from localspec.models.registry import load_registry

    model = pair.drafter or load_registry().models.get(f"{pair.target.id}-assistant")
    artifact = None if model is None else (model.artifacts.get("torch") or model.safetensors)
    return artifact.repo if isinstance(artifact, HubArtifact) else None


def _architecture(path: Path) -> str | None:
    from localspec.common.gguf_header import read_header

    try:
        return read_header(path).architecture if path.is_file() else None
    except LocalspecError:
        return None


def _is_assistant_file(path: Path) -> bool:
    from localspec.common.gguf_header import read_header

    try:
        return path.is_file() and read_header(path).is_assistant
    except LocalspecError:
        return False


def _vocab_refusal(engine: str, target: str, drafter: str) -> list[str]:
    rows = KNOWN_VOCAB_ROWS.get(target), KNOWN_VOCAB_ROWS.get(drafter)
    if None in rows or rows[0] == rows[1]:
        return []
    name = {"vllm": "vLLM", "sglang": "SGLang"}[engine]
    return [
        f"warning: {name} refuses this pair: it requires equal vocabulary sizes, and {target} has "
        f"{rows[0]} embedding rows, {drafter} {rows[1]} (padding only: localspec runs the pair). "
        "Use --to llama-server, or --strategy ngram"
    ]


def _vllm(target: str, method: str, drafter: str | None, k: int) -> tuple[str, ...]:
    config: dict[str, object]
    if method == "mtp":  # the model's own MTP layers, or its assistant (Gemma 4's) as the model
        config = {"method": "mtp", **({"model": drafter} if drafter else {}), "num_speculative_tokens": k}
    elif drafter:
        config = {"method": "draft_model", "model": drafter, "num_speculative_tokens": k}
    else:
        config = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": PROMPT_LOOKUP_MAX,
            "prompt_lookup_min": PROMPT_LOOKUP_MIN,
        }
    return ("vllm", "serve", target, "--host", HOST, "--speculative-config", json.dumps(config))


def _sglang(target: str, drafter: str | None, k: int) -> tuple[str, ...]:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", target, "--host", HOST]
    if drafter:
        # A standalone drafter proposes one chain (top-k 1) of k tokens; the target verifies k + 1.
        argv += ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", drafter]
        argv += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
        argv += ["--speculative-num-draft-tokens", str(k + 1)]
    else:
        argv += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(k)]
    return tuple(argv)


def _dflash(engine: str, target: str, drafter: str, k: int) -> tuple[str, ...]:
    """vLLM's dflash method, or SGLang's DFLASH algorithm (its block size comes from the
    drafter's config, so SGLang takes no draft length)."""
    if engine == "vllm":
        config = {"method": "dflash", "model": drafter, "num_speculative_tokens": k}
        return ("vllm", "serve", target, "--host", HOST, "--speculative-config", json.dumps(config))
    argv = ["python", "-m", "sglang.launch_server", "--model-path", target, "--host", HOST]
    argv += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter]
    return tuple(argv)


def _llama_server_dflash(target: Path, drafter: Path, k: int, spec_type: str = "draft-dflash") -> tuple[str, ...]:
    """llama-server's draft-dflash, or draft-dspark (the same flags: p-min 0 reads no confidence head)."""
    argv = ["llama-server", "-m", str(target), "--host", HOST, "-md", str(drafter)]
    argv += ["--spec-type", spec_type, "--spec-draft-n-max", str(k)]
    argv += ["--spec-draft-n-min", "0", "--spec-draft-p-min", str(LLAMA_SERVER_P_MIN)]
    return tuple(argv)


def _sglang_mtp(target: str, k: int, assistant: str | None = None) -> tuple[str, ...]:
    # SGLang runs a model's built-in MTP layers as EAGLE with no draft model path (NEXTN is
    # its older alias): k steps of one chain, k + 1 tokens verified. Gemma 4's assistant is
    # given as the draft model under NEXTN, which SGLang promotes to its FROZEN_KV_MTP
    # algorithm when the path is a Gemma4AssistantForCausalLM.
    argv = ["python", "-m", "sglang.launch_server", "--model-path", target, "--host", HOST]
    if assistant is not None:
        argv += ["--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", assistant]
    else:
        argv += ["--speculative-algorithm", "EAGLE"]
    argv += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
    argv += ["--speculative-num-draft-tokens", str(k + 1)]
    return tuple(argv)


def _llama_server_mtp(target: Path, sidecar: Path | None, k: int) -> tuple[str, ...]:
    """draft-mtp: the target's own nextn layers, or the assistant sidecar given as -md."""
    argv = ["llama-server", "-m", str(target), "--host", HOST]
    argv += ["-md", str(sidecar)] if sidecar is not None else []
    argv += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(k)]
    argv += ["--spec-draft-n-min", "0", "--spec-draft-p-min", str(LLAMA_SERVER_P_MIN)]
    return tuple(argv)


def _sidecar_path(pair: Pair, target: Path) -> Path | None:
    """The pulled sidecar: in the same snapshot folder as the target's file."""
    sidecar, artifact = sidecar_of(pair.target), pair.target.artifacts.get("llamacpp")
    if sidecar is None or not isinstance(artifact, HubArtifact):
        return None
    return _snapshot_of(target, artifact).joinpath(*PurePosixPath(sidecar.name).parts)


def _projector_beside(pair: Pair, ggufs: GgufResolver) -> Path | None:
    """The projector where ggufs (the caller's own resolver) put the target: beside it, in the
    same snapshot folder, when it comes from the target's repo at its revision and is there."""
    assert pair.mmproj is not None
    projector, target = pair.mmproj.artifacts.get("llamacpp"), pair.target.artifacts.get("llamacpp")
    if not isinstance(projector, HubArtifact) or not isinstance(target, HubArtifact):
        return None
    if (projector.repo, projector.revision) != (target.repo, target.revision):
        return None
    path = _snapshot_of(ggufs(pair)[0], target).joinpath(*PurePosixPath(projector.files[0].name).parts)
    return path if path.is_file() else None


def _snapshot_of(path: Path, artifact: HubArtifact) -> Path:
    """The snapshot folder holding the artifact's first file at path."""
    for _ in PurePosixPath(artifact.files[0].name).parts:
        path = path.parent
    return path


def _llama_server(target: Path, drafter: Path | None, k: int) -> tuple[str, ...]:
    argv = ["llama-server", "-m", str(target), "--host", HOST]
    if drafter:
        argv += ["-md", str(drafter), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k)]
        argv += ["--spec-draft-n-min", "0", "--spec-draft-p-min", str(LLAMA_SERVER_P_MIN)]
    else:
        # ngram-simple matches the last size-n tokens and drafts the size-m that followed.
        argv += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(PROMPT_LOOKUP_MAX)]
        argv += ["--spec-ngram-simple-size-m", str(k)]
    return tuple(argv)


def _export_eagle3(
    pair: Pair, engine: str, draft_tokens: int | None, ggufs: GgufResolver | None, notes: list[str]
) -> Export:
    """EAGLE-3: the head (a GGUF drafter of architecture eagle3 for llama-server, else
    models.toml's `<target id>-eagle3` checkpoint) reads the target's hidden layers; each
    engine's own EAGLE-3, one chain of k tokens."""
    k = draft_tokens if draft_tokens is not None else _fixed_draft_tokens(pair, engine, "eagle3", notes)
    if engine == "llama-server":
        target, drafter = (ggufs or _pulled_ggufs)(pair)
        head = drafter if drafter is not None and _architecture(drafter) == "eagle3" else None
        return Export(engine, _llama_server_eagle3(target, head or _unconverted(pair, target, notes), k), tuple(notes))
    target_repo, head_repo = _torch_repo(pair.target, engine), _torch_repo(_eagle3_head(pair), engine)
    if engine == "vllm":
        config = {"method": "eagle3", "model": head_repo, "num_speculative_tokens": k}
        argv = ["vllm", "serve", target_repo, "--host", HOST, "--speculative-config", json.dumps(config)]
        return Export(engine, tuple(argv), tuple(notes))
    argv = ["python", "-m", "sglang.launch_server", "--model-path", target_repo, "--host", HOST]
    argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", head_repo]
    argv += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
    argv += ["--speculative-num-draft-tokens", str(k + 1)]
    return Export(engine, tuple(argv), tuple(notes))


def _llama_server_eagle3(target: Path, head: Path, k: int) -> tuple[str, ...]:
    argv = ["llama-server", "-m", str(target), "--host", HOST, "-md", str(head), "--spec-type", "draft-eagle3"]
    argv += ["--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", str(LLAMA_SERVER_P_MIN)]
    return tuple(argv)


def _unconverted(pair: Pair, target: Path, notes: list[str]) -> Path:
    """Where the head's GGUF goes, beside the target as llama.cpp names it (eagle3-*.gguf,
    common/download.cpp), with how to convert it in the notes."""
    head, path = _eagle3_head(pair), target.with_name(f"eagle3-{target.name}")
    source = head.safetensors.repo if isinstance(head.safetensors, HubArtifact) else head.name
    notes.append(
        f"no GGUF of {head.name} is in models.toml: convert it with llama.cpp's convert_hf_to_gguf.py "
        f"{source} --target-model-dir <{pair.target.name} checkpoint> --outfile {path}"
    )
    return path


def _eagle3_head(pair: Pair) -> Model:
    from localspec.models.registry import load_registry

    own = _exported_as(pair.strategy) == "eagle3"  # the pair's drafter is the head
    head = pair.drafter if own else load_registry().models.get(f"{pair.target.id}-eagle3")
    if head is None:
        raise ExportError(
            f"pair {pair.id!r} has no EAGLE-3 head in models.toml (a model {pair.target.id}-eagle3, or its drafter)",
            "export it with --strategy ngram" + (" or draft" if pair.drafter is not None else ""),
        )
    return head


def _pulled_ggufs(pair: Pair) -> tuple[Path, Path | None]:
    from localspec.models.pull import resolve_pair

    resolved = resolve_pair(pair.id, backend="llamacpp")
    return resolved.target, resolved.drafter
