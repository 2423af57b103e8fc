"""`localspec rpc-server`: llama.cpp's RPC server on this machine's CPU, for a target split
over machines with --rpc. It runs the installed llama.cpp's own server code in-process, so
it needs no separate build and always speaks the same protocol version as this localspec."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localspec.backends.llamacpp.rpc_server import DEFAULT_HOST, DEFAULT_PORT, SECURITY_NOTE


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
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="listen on an address other machines can reach (RPC has no authentication)",
    )
    # The server itself, run by the supervising process (which restarts it after a crash).
    p.add_argument("--unsupervised", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from localspec.backends.llamacpp.rpc_server import is_loopback, serve, supervise, watch_parent

    if not is_loopback(args.host) and not args.allow_remote:
        print(
            f"localspec: error: {args.host} can be reached from other machines, and {SECURITY_NOTE}\n"
            "  -> add --allow-remote to listen there anyway (on a trusted network only)",
            file=sys.stderr,
        )
        return 2
    if args.unsupervised:
        watch_parent()
        serve(args.host, args.port, args.threads, args.cache)
        return 0
    if not is_loopback(args.host):
        print(f"localspec: warning: listening on {args.host}: {SECURITY_NOTE}", file=sys.stderr)
    command = [sys.executable, "-m", "localspec", "rpc-server", "--unsupervised", "--host", args.host]
    command += ["--port", str(args.port), "--allow-remote"]
    command += ["--threads", str(args.threads)] if args.threads else []
    command += ["--cache", args.cache] if args.cache else []
    code: int = supervise(command, sys.stderr)
    return code
