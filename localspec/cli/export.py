"""`localspec export PAIR --to vllm|sglang|llama-server`: the command that serves a pair with
that engine's own speculative decoding, for when one machine or one user is not enough."""

from __future__ import annotations

import argparse
from typing import Any

from localspec.models.export import ENGINES


def register(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="print the command serving a pair with vLLM, SGLang or llama-server",
        description="Print a command that runs PAIR with the chosen engine's own speculative decoding "
        "(vLLM and SGLang load the pair's safetensors repos, llama-server its pulled GGUF files), "
        "with a note where the engine is known to refuse the pair.",
    )
    p.add_argument("pair", help="a pair id or alias from models.toml")
    p.add_argument("--to", required=True, choices=ENGINES, help="the serving engine")
    p.add_argument(
        "--strategy",
        choices=["draft", "ngram", "mtp", "dflash", "dspark", "eagle3"],
        help="default: the pair's (a DFlash pair's is dflash), or mtp where the target ships an MTP assistant",
    )
    p.add_argument("--draft-tokens", type=int, metavar="N", help="draft length (default: the pair's, or 4; 3 for MTP)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from localspec.core.errors import InvalidRequestError
    from localspec.models.export import export_pair
    from localspec.models.registry import load_registry

    if args.draft_tokens is not None and args.draft_tokens < 1:
        raise InvalidRequestError(f"--draft-tokens must be 1 or more, got {args.draft_tokens}")
    pair = load_registry().pair(args.pair)
    print(export_pair(pair, args.to, draft_tokens=args.draft_tokens, strategy=args.strategy).script())
    return 0
