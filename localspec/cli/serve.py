"""`localspec serve`: an OpenAI-compatible local server with speculative decoding behind it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from localspec.cli.options import add_model_argument, add_model_options, load_options, model_given
from localspec.core.choices import STRATEGY_HELP
from localspec.core.errors import InvalidRequestError

DEFAULT_PAIR = "smollm2-135m"  # models.toml's pair for the embedded default


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the OpenAI API on this machine",
        description="An OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, /health) "
        "with speculative decoding behind it. Binds 127.0.0.1 unless told otherwise.",
    )
    add_model_argument(p)
    p.add_argument("--strategy", "-s", default="auto", help=STRATEGY_HELP)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    _add_access_options(p)
    p.add_argument(
        "--parallel",
        "-np",
        type=_parallel_arg,
        default=None,
        metavar="N",
        help="requests decoded at once, in shared passes (default 4, fewer where 4 lanes, each a cache of --ctx "
        "and its drafter's, would take over a quarter of the free memory; 1: one at a time). Plain decoding, "
        "n-gram lookup, a draft model, "
        "MTP heads, Gemma 4 assistants, EAGLE-3 heads and DFlash/DSpark drafters batch; "
        "qspec and layerskip serve one request at a time",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests that may wait beside those running; more get 503 with Retry-After (default 64)",
    )
    _add_cache_options(p)
    add_model_options(p)
    p.set_defaults(handler=handle)


def _add_access_options(p: argparse.ArgumentParser) -> None:
    """Who may call the server: its key, the browser origins and the host names it answers."""
    p.add_argument(
        "--api-key",
        default=os.environ.get("LOCALSPEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route; /health without it says "
        "only whether the server lives (default: $LOCALSPEC_API_KEY)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed to call the server, scheme://host[:port] (repeatable; default: none; "
        "'*': every origin, with a warning)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name clients may reach the server by, besides localhost, loopback addresses and --host "
        "(repeatable; '*' turns the check off, behind a proxy that checks names); other Host headers get 403, "
        "so a web page cannot reach the server through a domain it points here (DNS rebinding)",
    )
    p.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch an image_url part's http(s) URL (default: refused, send images inline as data URLs): public "
        "addresses only, at most 32 MiB, 10 s and 3 redirects, the bytes checked to be an image",
    )
    p.add_argument(
        "--allow-private-image-urls",
        action="store_true",
        help="as --allow-image-urls, and from loopback, private and link-local addresses too: for images on your "
        "own network; any client may then make the server read from those addresses",
    )


def _add_cache_options(p: argparse.ArgumentParser) -> None:
    """What one request may reuse of the ones before it: n-gram memory, a cached prompt prefix."""
    p.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        help="n-gram lookup searches only each request's own text, not earlier requests' (keeps clients' "
        "requests apart, in timing too)",
    )
    prefix = p.add_mutually_exclusive_group()
    prefix.add_argument(
        "--no-prefix-cache",
        dest="prefix_cache",
        action="store_false",
        help="reuse no cached prompt prefix across requests, whatever a request's cache_prompt says: every "
        "prompt is evaluated whole, as a fresh process would",
    )
    prefix.add_argument(
        "--cache-prompt",
        action="store_true",
        help="reuse any cached prompt prefix by default (a request's cache_prompt decides for itself): faster "
        "follow-ups, but a near-tie can then go another way than in a fresh evaluation, so an answer may depend "
        "on earlier requests; by default only a prefix evaluated as a fresh request would is reused",
    )


def handle(args: argparse.Namespace) -> int:
    from localspec.pool import load_pool
    from localspec.server import Catalog, LocalServer, Settings
    from localspec.server.cors import CorsRule

    if args.max_queue < 0:
        raise InvalidRequestError(f"--max-queue must be 0 or more, got {args.max_queue}")
    cors = CorsRule.of(args.cors_origin)  # a value that is no origin is said before anything loads
    model = model_given(args)
    options = load_options(args).changed(model=model)
    served = _served_id(model, args.draft_model)
    _check_before_listening(model, args.draft_model, args.backend)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def loader(pair_id: str) -> Any:
        chosen = options if pair_id == served else options.changed(model=pair_id, draft_model=None)
        pool = load_pool(chosen, parallel=args.parallel, on_progress=lambda what: say(f"localspec serve: {what}"))
        if pool.note:
            say(f"localspec serve: {pool.note}")
        return pool

    # Another pair may be loaded on request only where pairs are what is served.
    catalog = Catalog(served, backend=args.backend, pairs=args.draft_model is None and not _is_file(model))
    try:
        # Listening first: a busy port is said at once, and requests sent while the model
        # loads wait for it instead of being refused.
        server = LocalServer(
            None,
            served,
            loader,
            host=args.host,
            port=args.port,
            max_queue=args.max_queue,
            catalog=catalog,
            settings=Settings(
                api_key=args.api_key or None,
                cors_origins=args.cors_origin,
                allowed_hosts=args.allow_host,
                cache_prompt=args.cache_prompt,
                prefix_cache=args.prefix_cache,
                log=say,
                image_urls=_image_urls(args),
            ),
        )
    except OSError as exc:
        raise InvalidRequestError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", "pick another --port (0: any free one)"
        ) from None
    for warning in _access_warnings(args, cors.warning()):
        say(warning)
    say(f"localspec serve: listening at {server.url}; loading {served}, requests wait for it  (Ctrl+C stops)")
    server.serve()
    say("localspec serve: stopped")
    return 0


def _image_urls(args: argparse.Namespace) -> Any:
    """Whether image URLs are fetched, and from which addresses (server/image_urls.py)."""
    from localspec.server.image_urls import ImageUrls

    private = args.allow_private_image_urls
    return ImageUrls(allow=args.allow_image_urls or private, private=private)


def _parallel_arg(value: str) -> int:
    from localspec.pool import check_parallel

    try:
        return check_parallel(int(value))
    except (ValueError, InvalidRequestError):
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 16, got {value!r}") from None


def _access_warnings(args: argparse.Namespace, cors: str | None) -> list[str]:
    """What makes the server reachable by more than its user means, in words (cors: CorsRule's)."""
    from localspec.server import local_only

    warnings = []
    if not local_only(args.host) and not args.api_key:
        warnings.append(
            f"warning: listening on {args.host} without an API key: anyone who can reach this machine can use it "
            "(set --api-key or LOCALSPEC_API_KEY)"
        )
    if args.allow_private_image_urls:
        warnings.append(
            "warning: --allow-private-image-urls: any client of this server can make it read images from this "
            "machine and your network"
        )
    if cors is not None:
        warnings.append(cors)
    if args.api_key and not args.api_key.isascii():
        warnings.append(
            "warning: the API key is not ASCII: it is compared as UTF-8, but some clients (the openai SDKs "
            "among them) can only send ASCII headers; an ASCII key works everywhere"
        )
    return warnings


def _check_before_listening(model: str | None, draft_model: str | None, backend: str) -> None:
    """What takes milliseconds to know is said before the port is taken, so a launcher sees
    the server exit instead of a port that opens and closes: a pair that is not pulled, a
    file that is not there."""
    from localspec.common.gguf_header import open_model_file
    from localspec.models.pull import resolve_pair

    if model is not None and not _is_file(model):
        resolve_pair(model, backend=backend)
    for path in (model, draft_model):
        if path is not None and _is_file(path) and not path.startswith("reference") and not os.path.exists(path):
            open_model_file(path)  # raises the message that says what to do


def _is_file(model: str | None) -> bool:
    """A model file (or a reference model's spec) rather than a pair of models.toml."""
    return model is not None and (os.path.exists(model) or model.endswith(".gguf") or model.startswith("reference"))


def _served_id(model: str | None, draft_model: str | None) -> str:
    """The model id clients name: the pair id (a pair's target file included, models.naming),
    or the file's name for another GGUF file; with the drafter's file after a "+"."""
    from localspec.models.naming import canonical_name

    if model is not None and not _is_file(model):
        from localspec.models.registry import load_registry

        return load_registry().pair(model).id
    name = canonical_name(model).removesuffix(".gguf")
    return name if draft_model is None else f"{name}+{Path(draft_model).stem}"
