"""`localspec registry check [PAIR...]`: the maintainer's audit of models.toml against the hub."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("registry", help="audit models.toml against the hub", description="Audit models.toml.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="ask the hub about every entry: repos, revisions, files, sizes, sha256s, tokenizer fit",
        description="Ask the hub whether each pair's repos, revisions and files exist, whether their sizes and "
        "sha256s agree with models.toml, and whether each pair's tokenizers fit (from the GGUF headers, by range "
        "requests: no weights are downloaded). Exits 1 on any mismatch. Honours HF_TOKEN and HF_ENDPOINT.",
    )
    check.add_argument("pairs", nargs="*", metavar="PAIR", help="pairs to check (default: all)")
    check.add_argument("--endpoint", metavar="URL", help="hub endpoint (default: $HF_ENDPOINT or huggingface.co)")
    check.set_defaults(handler=handle_check)


def handle_check(args: argparse.Namespace) -> int:
    from localspec.cli.models import table
    from localspec.models.audit import check_registry

    findings = check_registry(
        args.pairs, endpoint=args.endpoint, on_pair=lambda p: print(f"checking {p}...", file=sys.stderr, flush=True)
    )
    rows = [["PAIR", "BACKEND", "CHECKED", "RESULT", "DETAIL"]]
    rows += [[f.pair, f.backend, f.subject, f.result, f.detail] for f in findings]
    print("\n".join(table(rows)))
    bad = sum(not f.ok and f.checked for f in findings)
    unchecked = sum(not f.checked for f in findings)
    parts = [f"{bad} mismatch{'es' if bad != 1 else ''}"] if bad else []
    if unchecked:
        parts.append(f"{unchecked} not checked (the hub could not be asked: check the connection, or HF_ENDPOINT)")
    print(f"{', '.join(parts)} in {len(findings)} checks" if parts else f"all {len(findings)} checks agree")
    return 1 if bad or unchecked else 0
