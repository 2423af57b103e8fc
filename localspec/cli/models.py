"""`localspec list`, `show`, `rm` and `path`: the registry's pairs and where things live."""

from __future__ import annotations

import argparse
import json
from typing import Any

from localspec.core.choices import PULLABLE_BACKENDS
from localspec.models.entries import Artifact, HubArtifact, LocalArtifact, Model, Pair, sidecar_of
from localspec.models.registry import load_registry
from localspec.models.sizes import Size, human_bytes

PATH_NAMES = ("data", "registry", "user-registry", "hub-cache")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "list",
        help="list the model pairs: sizes, pulled or not",
        description="List the model pairs. MTP: yes where a model's own multi-token-prediction head drafts, "
        "later where the target comes with an MTP assistant that the pair does not draft with "
        "(--strategy mtp does).",
    )
    p.add_argument(
        "--backend", default="llamacpp", choices=PULLABLE_BACKENDS, help="whose sizes and pulled state to show"
    )
    p.add_argument("--json", action="store_true", help="one JSON array, every backend")
    p.set_defaults(handler=handle_list)

    p = sub.add_parser("show", help="show one pair: models, files, strategy", description="Show one model pair.")
    p.add_argument("pair", help="pair id or alias")
    p.set_defaults(handler=handle_show)

    p = sub.add_parser("rm", help="delete a pulled pair's files", description="Delete a pulled pair's files.")
    p.add_argument("pair", help="pair id or alias")
    p.add_argument("--backend", default="llamacpp", choices=PULLABLE_BACKENDS)
    p.set_defaults(handler=handle_rm)

    p = sub.add_parser("path", help="where localspec keeps things", description="Where localspec keeps things.")
    p.add_argument("which", nargs="?", choices=PATH_NAMES, help="print just this path")
    p.set_defaults(handler=handle_path)


def table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def handle_list(args: argparse.Namespace) -> int:
    from localspec.models.pull import is_pulled, pair_size

    pairs = list(load_registry().pairs.values())
    if args.json:
        print(json.dumps([_pair_json(p) for p in pairs], indent=1))
        return 0
    rows = [["PAIR", "TARGET", "DRAFTER", "STRATEGY", "MTP", "SIZE", "PULLED", "BACKENDS"]]
    for p in pairs:
        offered = args.backend in p.backends
        rows.append(
            [
                p.id,
                p.target.name,
                p.drafter.name if p.drafter else "-",
                p.strategy,
                p.mtp or "-",
                _size_cell(pair_size(p, args.backend)) if offered else "-",
                ("yes" if is_pulled(p, args.backend) else "no") if offered else "-",
                ",".join(p.backends),
            ]
        )
    print("\n".join(table(rows)))
    if any(r[5].startswith("~") for r in rows):
        print("~ an estimate from the parameter count and quantization; `localspec pull PAIR --dry-run` asks the hub")
    return 0


def _size_cell(size: Size | None) -> str:
    return "?" if size is None else size.human()


def _size_json(size: Size | None) -> dict[str, Any]:
    """size: bytes, or None where nothing is known; size_estimated: from the parameter count."""
    return {"size": None if size is None else size.bytes, "size_estimated": size is not None and not size.exact}


def _pair_json(pair: Pair) -> dict[str, Any]:
    from localspec.models.pull import is_pulled, pair_size

    return {
        "id": pair.id,
        "aliases": list(pair.aliases),
        "description": pair.description,
        "family": pair.family,
        "license": pair.license,
        "target": pair.target.id,
        "drafter": pair.drafter.id if pair.drafter else None,
        "mmproj": pair.mmproj.id if pair.mmproj else None,
        "strategy": pair.strategy,
        "mtp": pair.mtp,
        "draft_tokens": pair.draft_tokens,
        "backends": {b: {"pulled": is_pulled(pair, b), **_size_json(pair_size(pair, b))} for b in pair.backends},
    }


def handle_show(args: argparse.Namespace) -> int:
    from localspec.models.pull import NotPulledError, pull_command, resolve_pair

    pair = load_registry().pair(args.pair)
    aliases = f"  (aliases: {', '.join(pair.aliases)})" if pair.aliases else ""
    draft = "auto (chosen per step)" if pair.draft_tokens == "auto" else str(pair.draft_tokens)
    lines = [f"{pair.id}{aliases}", pair.description, ""]
    rows = [
        ["family", pair.family],
        ["license", pair.license],
        ["strategy", f"{pair.strategy}, draft length {draft}"],
    ]
    if pair.mtp is not None:
        rows.append(["mtp", _mtp_line(pair)])
    lines += table(rows)
    for role, model in (("target", pair.target), ("drafter", pair.drafter), ("projector (images)", pair.mmproj)):
        if model is not None:
            lines += ["", f"{role}: {model.name} ({model.params}, {model.license})", *_artifact_lines(model)]
    state = []
    for backend in pair.backends:
        try:
            state.append(["", backend, f"pulled: {resolve_pair(pair.id, backend).target}"])
        except NotPulledError:
            state.append(["", backend, f"not pulled: {pull_command(pair, backend)}"])
    lines += ["", "files:", *table(state), "", f"defined in {pair.origin}"]
    print("\n".join(lines))
    return 0


def _mtp_line(pair: Pair) -> str:
    sidecar = sidecar_of(pair.target)
    if pair.mtp == "yes":
        if sidecar is not None:
            return f"its MTP assistant {sidecar.name} drafts (llama.cpp backend)"
        return "the target's own MTP head drafts (llama.cpp backend)"
    assert sidecar is not None
    return f"assistant {sidecar.name} comes with the target; --strategy mtp drafts with it (llama.cpp backend)"


def _artifact_lines(model: Model) -> list[str]:
    rows = [["", backend, *_describe(artifact)] for backend, artifact in model.artifacts.items()]
    return table(rows)


def _describe(artifact: Artifact) -> list[str]:
    if isinstance(artifact, HubArtifact):
        return [f"{artifact.repo}@{artifact.revision}", ", ".join(f.name for f in artifact.files)]
    if isinstance(artifact, LocalArtifact):
        return ["your own files", str(artifact.path)]
    src = artifact.source
    return [f"PyPI {src.package}=={src.version}", f"{src.member} (sha256 {src.sha256[:12]}...)"]


def handle_rm(args: argparse.Namespace) -> int:
    from localspec.models.removal import remove

    removal = remove(args.pair, args.backend)
    for model, freed in removal.removed:
        print(f"removed {model} ({human_bytes(freed)})")
    for model, users in removal.kept:
        pairs = [u for u in users if " " not in u]  # pair ids; the rest are reasons in words
        if pairs:
            print(f"kept {model}: pulled pair {', '.join(pairs)} {'is' if len(pairs) == 1 else 'are'} still using it")
        if len(pairs) < len(users):
            print(f"kept {model}: {'; '.join(u for u in users if ' ' in u)}")
    return 0


def _paths() -> dict[str, str]:
    from localspec.models.hub_settings import hub_cache_dir
    from localspec.models.registry import packaged_registry_file, user_registry_file
    from localspec.store import data_dir

    return {
        "data": str(data_dir()),
        "registry": str(packaged_registry_file()),
        "user-registry": str(user_registry_file()),
        "hub-cache": str(hub_cache_dir()),
    }


def handle_path(args: argparse.Namespace) -> int:
    from localspec.models.registry import user_registry_file

    paths = _paths()
    if args.which:
        print(paths[args.which])
        return 0
    absent = "" if user_registry_file().is_file() else "  (absent: create it to add pairs)"
    rows = [["data", paths["data"]], ["registry", paths["registry"]]]
    rows += [["user-registry", paths["user-registry"] + absent], ["hub-cache", paths["hub-cache"]]]
    print("\n".join(table(rows)))
    return 0
