"""`localspec add NAME --target T.gguf --drafter D.gguf`: a pair of the user's own GGUF files,
checked (both readable, tokenizers that fit) and written to the user's models.toml as two
`path =` models and a pair, so it runs with no hub at all.

A vision model's projector (an mmproj GGUF, llama.cpp's `clip` architecture) is recognised
too: given with --mmproj, or found beside the target (a file in its folder whose name holds
"mmproj" and whose output width is the target's), and written as the pair's `mmproj`, so
the pair reads images with no --mmproj at `run`."""

from __future__ import annotations

import json
import re
from pathlib import Path

from localspec.common.gguf_header import check_gguf, check_whole_gguf, resolve_model_path
from localspec.core.choices import FEATURE_DRAFTERS, DraftTokens
from localspec.core.errors import InvalidRequestError, ModelLoadError, PairMismatchError
from localspec.core.protocol import vocab_mismatch
from localspec.models.entries import Pair
from localspec.models.registry import load_registry, user_registry_file
from localspec.store import write_atomic
from localspec.strategies import TABLE

_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_HEADER = "# Your own pairs and models, merged over localspec's (`localspec path registry`).\n"


def add_local_pair(
    name: str,
    target: Path,
    drafter: Path | None = None,
    draft_tokens: DraftTokens = "auto",
    description: str = "",
    mmproj: Path | None = None,
) -> Pair:
    """Check the files and append the pair to the user's models.toml; returns the pair as
    the registry now reads it. Nothing is written when a check fails. mmproj: the target's
    vision projector; None: the one found beside the target, if any (see the module doc)."""
    if not _ID.match(name):
        raise InvalidRequestError(f"{name!r} cannot name a pair", "use lowercase letters, digits, '.', '_' and '-'")
    registry = load_registry()
    ids = {"target": f"{name}-target", "drafter": f"{name}-drafter", "mmproj": f"{name}-mmproj"}
    taken = [i for i in (name, *ids.values()) if i in registry.pairs or i in registry.models]
    taken += [name] if any(name in p.aliases for p in registry.pairs.values()) else []
    if taken:
        raise InvalidRequestError(
            f"{taken[0]!r} is already in the registry", f"choose another name, or edit {user_registry_file()}"
        )
    files = {"target": resolve_model_path(target)} | (
        {"drafter": resolve_model_path(drafter)} if drafter is not None else {}
    )
    for path in files.values():
        check_gguf(str(path))
        check_whole_gguf(path)  # a cut download is refused now, not at the first `run`
    for role, path in files.items():
        if _is_projector(path):
            raise InvalidRequestError(
                f"{path.name} is a vision projector (mmproj), not a model: it cannot be the pair's {role}",
                "give it with --mmproj, and the model it was made for as --target",
            )
    projector = _projector(files["target"], mmproj)
    if "drafter" in files:
        reason = _mismatch(files["target"], files["drafter"])
        if reason is not None:
            raise PairMismatchError(
                f"{files['drafter'].name} cannot draft for {files['target'].name}: {reason}",
                "pick a drafter from the target's own family (same tokenizer), or leave out --drafter (n-gram lookup)",
            )
    text = "".join(_model_entry(ids[role], name, path) for role, path in files.items())
    text += _model_entry(ids["mmproj"], name, projector) if projector is not None else ""
    text += _pair_entry(name, ids, files, _strategy(files), draft_tokens, description)
    text += f"mmproj = {_quote(ids['mmproj'])}\n" if projector is not None else ""
    _append(user_registry_file(), text)
    return load_registry().pair(name)


def _is_projector(path: Path) -> bool:
    """Whether the GGUF is a projector, vision or audio (llama.cpp's mmproj files: architecture clip)."""
    from localspec.common.gguf_header import read_header

    return read_header(path).architecture == "clip"


def _projector(target: Path, given: Path | None) -> Path | None:
    """The target's projector: the one given, checked; else the one beside it, if one fits."""
    if given is not None:
        path = resolve_model_path(given)
        check_gguf(str(path))
        check_whole_gguf(path)
        if not _is_projector(path):
            raise InvalidRequestError(
                f"{path.name} is not a vision projector (its architecture is not clip)",
                "give the mmproj GGUF published beside the model (mmproj-*.gguf)",
            )
        if (why := _projector_misfit(target, path)) is not None:
            raise InvalidRequestError(f"{path.name} cannot read images for {target.name}: {why}", _MMPROJ_FIX)
        return path
    beside = sorted(p for p in target.parent.glob("*.gguf") if "mmproj" in p.name.lower() and p != target)
    fitting = [p for p in beside if _fits_beside(target, p)]
    if len(fitting) > 1:
        names = ", ".join(p.name for p in fitting)
        raise InvalidRequestError(f"several projectors beside {target.name} fit it: {names}", "pick one with --mmproj")
    return fitting[0] if fitting else None


def _fits_beside(target: Path, candidate: Path) -> bool:
    """Whether a file found beside the target is a projector for it (one unreadable is not)."""
    try:
        return _is_projector(candidate) and _projector_misfit(target, candidate) is None
    except ModelLoadError:  # a cut or foreign file that happens to be named mmproj
        return False


_MMPROJ_FIX = "give the projector made for this model (its repo's mmproj-*.gguf)"


def _projector_misfit(target: Path, projector: Path) -> str | None:
    """Why the projector cannot feed the target (an output width, its vision or audio
    encoder's, that is not the target's), or None; a file that declares no width is left to
    llama.cpp's check at load."""
    from localspec.common.gguf_header import read_header

    model, clip = read_header(target), read_header(projector).meta
    encoders = [kind for kind in ("vision", "audio") if clip.get(f"clip.has_{kind}_encoder", False)]
    if not encoders:
        return "it reads neither images nor audio (no vision or audio encoder)"
    width = model.meta.get(f"{model.architecture}.embedding_length")
    for kind in encoders:
        out = clip.get(f"clip.{kind}.projection_dim")
        if isinstance(width, int) and isinstance(out, int) and width != out:
            return f"its {kind} output is {out} wide, the model's embeddings {width}"
    return None


def _model_entry(model_id: str, family: str, path: Path) -> str:
    meta = _metadata(path)
    lines = [
        f"\n[models.{_quote(model_id)}]",
        f"name = {_quote(meta.get('general.name') or path.stem)}",
        f"family = {_quote(family)}  # the pair's own: `localspec add` checked that the tokenizers fit",
        f"license = {_quote(meta.get('general.license') or 'unknown')}",
        f"params = {_quote(meta.get('general.size_label') or '?')}",
        f"llamacpp = {{ path = {_quote(str(path))} }}",
    ]
    return "\n".join(lines) + "\n"


def _mismatch(target: Path, drafter: Path) -> str | None:
    """Why the drafter cannot draft for the target, or None. An MTP assistant is checked as
    one: made for the target's width, with its tokenizer where the file carries one."""
    from localspec.common.gguf_header import gguf_vocab_identity, read_header
    from localspec.models.audit import mtp_drafter_fit

    header = read_header(drafter)
    if header.is_assistant:
        fits, detail = mtp_drafter_fit(read_header(target), header)
        return None if fits else detail
    return vocab_mismatch(gguf_vocab_identity(target), gguf_vocab_identity(drafter))


def _strategy(files: dict[str, Path]) -> str:
    """mtp for a target drafted by its own MTP head (nextn layers in its GGUF) or by an MTP
    assistant, which no other strategy runs; eagle3 for an EAGLE-3 head; else draft with a
    drafter, n-gram lookup without."""
    from localspec.common.gguf_header import read_header

    if "drafter" in files:
        drafter = read_header(files["drafter"])
        if drafter.architecture in FEATURE_DRAFTERS:  # a head that reads the target's layers (eagle3)
            return drafter.architecture
        return "mtp" if drafter.is_assistant else "draft"
    return "mtp" if read_header(files["target"]).nextn_layers > 0 else "ngram"


def _pair_entry(
    name: str, ids: dict[str, str], files: dict[str, Path], strategy: str, draft_tokens: DraftTokens, description: str
) -> str:
    drafter = files.get("drafter")
    alone = "by its own MTP head" if TABLE[strategy].exports_as == "mtp" else "alone"
    default = f"{files['target'].name} drafted by {drafter.name}" if drafter else f"{files['target'].name} {alone}"
    lines = [
        f"\n[pairs.{_quote(name)}]",
        f"description = {_quote(description or default)}",
        f"target = {_quote(ids['target'])}",
        *([f"drafter = {_quote(ids['drafter'])}"] if drafter else []),
        f"strategy = {_quote(strategy)}",
        f"draft_tokens = {_quote(draft_tokens) if draft_tokens == 'auto' else draft_tokens}",
    ]
    return "\n".join(lines) + "\n"


def _quote(value: str) -> str:
    """A TOML basic string: JSON's escapes are all valid TOML escapes."""
    return json.dumps(value)


def _metadata(path: Path) -> dict[str, str]:
    from localspec.common.gguf_header import read_header

    meta = read_header(path).meta
    keys = ("general.name", "general.license", "general.size_label")
    return {key: meta[key] for key in keys if isinstance(meta.get(key), str)}


def _append(path: Path, text: str) -> None:
    """Append atomically: the new file is read back as a registry before it replaces the old
    one, so a full disk or an entry the registry refuses leaves models.toml as it was."""
    before = path.read_text(encoding="utf-8") if path.is_file() else _HEADER
    write_atomic(path, before + text, check=_reads_as_registry)


def _reads_as_registry(written: Path) -> None:
    load_registry(written)  # raises RegistryError, naming the entry, for text it refuses
