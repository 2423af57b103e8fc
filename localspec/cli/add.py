"""`localspec add NAME --target T.gguf [--drafter D.gguf] [--mmproj P.gguf]`: a pair of your own GGUF files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from localspec.cli.options import draft_tokens_arg


def register(sub: Any) -> None:
    p = sub.add_parser(
        "add",
        help="add a pair of your own GGUF files to your models.toml",
        description="Check a target and a drafter GGUF (readable, same tokenizer) and add them as a pair to your "
        "models.toml (`localspec path user-registry`). The files stay where they are; no hub is needed.",
    )
    p.add_argument("name", help="the new pair's id")
    p.add_argument("--target", required=True, type=Path, metavar="T.gguf", help="the target model")
    p.add_argument("--drafter", type=Path, metavar="D.gguf", help="the drafter (default: n-gram lookup)")
    p.add_argument(
        "--mmproj",
        type=Path,
        metavar="FILE",
        help="the target's vision projector (default: an mmproj*.gguf beside the target that fits it)",
    )
    p.add_argument(
        "--draft-tokens", type=draft_tokens_arg, default="auto", metavar="N|auto", help="the pair's draft length"
    )
    p.add_argument("--description", default="", help="one line shown by `localspec list`")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from localspec.models.entries import LocalArtifact
    from localspec.models.local_pairs import add_local_pair
    from localspec.models.registry import user_registry_file

    pair = add_local_pair(args.name, args.target, args.drafter, args.draft_tokens, args.description, args.mmproj)
    print(f"added pair {pair.id} to {user_registry_file()}: {pair.description}")
    if pair.mmproj is not None and isinstance(file := pair.mmproj.artifacts.get("llamacpp"), LocalArtifact):
        print(f"with the vision projector {file.path.name}: its prompts may hold images (--image, /image)")
    print(f'run it with: localspec run --model {pair.id} "..."  or  localspec chat {pair.id}')
    return 0
