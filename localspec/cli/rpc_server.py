"""`localspec rpc-server`: llama.cpp's RPC server on this machine's CPU, for a target split
over machines with --rpc. It runs the installed llama.cpp's own server code as a child process,
so it needs no separate build and always speaks the same protocol version as this localspec;
this process listens in its place (the guard: one client at a time, idle ones closed) and
starts the child again when it crashes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localspec.backends.llamacpp.rpc_guard import (
    CRASH_BAN_MAX_S,
    CRASH_BAN_S,
    HANDSHAKE_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_CLIENTS,
)
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
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=IDLE_TIMEOUT_S,
        metavar="S",
        help="close a client silent for S seconds while another waits (the server serves one at a time; "
        f"default {IDLE_TIMEOUT_S:g}); a client that sends no request within {HANDSHAKE_TIMEOUT_S:g} s "
        "of connecting (or S, if shorter) is closed whether or not another waits",
    )
    p.add_argument(
        "--max-clients",
        type=int,
        default=MAX_CLIENTS,
        metavar="N",
        help=f"connections served or waiting at once; more are refused (default {MAX_CLIENTS})",
    )
    p.add_argument(
        "--crash-ban",
        type=float,
        default=CRASH_BAN_S,
        metavar="S",
        help="refuse a host for S seconds once llama.cpp's server dies during its session, twice as long "
        f"each time it happens again, up to {CRASH_BAN_MAX_S:g} s (default {CRASH_BAN_S:g}; 0: never refuse)",
    )
    # The server itself, run by the supervising process (which restarts it after a crash).
    p.add_argument("--unsupervised", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from localspec.backends.llamacpp.rpc_guard import Guard, GuardLimits, listen
    from localspec.backends.llamacpp.rpc_server import is_loopback, require_rpc, serve, supervise, watch_parent

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
    if not args.idle_timeout > 0 or args.max_clients < 1 or not args.crash_ban >= 0:
        print(
            "localspec: error: --idle-timeout and --max-clients must be positive, and --crash-ban 0 or more",
            file=sys.stderr,
        )
        return 2
    require_rpc()  # before "listening": a build without RPC could never serve
    listener = listen(args.host, args.port)  # a port in use is refused here, before the child starts
    if not is_loopback(args.host):
        print(f"localspec: warning: listening on {args.host}: {SECURITY_NOTE}", file=sys.stderr)
    private = listen("127.0.0.1", 0)  # the child's port, reachable only through the guard
    child_port = private.getsockname()[1]
    private.close()
    limits = GuardLimits(idle_s=args.idle_timeout, max_clients=args.max_clients, crash_ban_s=args.crash_ban)
    guard = Guard(listener, child_port, sys.stderr, limits)
    guard.start()
    print(
        f"localspec: rpc-server: listening on {args.host}:{args.port}; llama.cpp's server behind it "
        f"on 127.0.0.1:{child_port}",
        file=sys.stderr,
    )
    command = [sys.executable, "-m", "localspec", "rpc-server", "--unsupervised", "--host", "127.0.0.1"]
    command += ["--port", str(child_port)]
    command += ["--threads", str(args.threads)] if args.threads else []
    command += ["--cache", args.cache] if args.cache else []
    code: int = supervise(command, sys.stderr, guard.blame_crash)
    return code
