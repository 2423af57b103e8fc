"""`localspec rpc-server`: llama.cpp's RPC server on this machine's CPU, for a target split
over machines with --rpc. It runs the installed llama.cpp's own server code in-process, so
it needs no separate build and always speaks the same protocol version as this localspec."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localspec.rpc import DEFAULT_HOST, DEFAULT_PORT, SECURITY_NOTE


def register(sub: Any) -> None:
    p = sub.add_parser(
        "rpc-server",
        help="serve this machine's CPU to a target split with --rpc",
        description="Run llama.cpp's RPC server here; another machine then runs "
        f"`localspec run --rpc THIS_HOST:PORT ...`. {SECURITY_NOTE}.",
    )
    p.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST}: this machine only)"
    )
    p.add_argument("--port", "-p", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--threads", "-t", type=int, help="CPU threads (default: physical cores)")
    p.add_argument("--cache", metavar="DIR", help="keep received weights in DIR so a reload skips the network")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from localspec.rpc import serve

    if args.host not in (DEFAULT_HOST, "localhost", "::1"):
        print(f"localspec: warning: listening on {args.host}: {SECURITY_NOTE}", file=sys.stderr)
    serve(args.host, args.port, args.threads, args.cache)
    return 0
