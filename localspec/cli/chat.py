"""`localspec chat`: the full-screen terminal chat."""

from __future__ import annotations

import argparse
from typing import Any

from localspec.cli.options import add_model_argument, add_model_options, add_sampling_options, load_options, sampling
from localspec.core.choices import STRATEGY_HELP
from localspec.core.validate import arg_text


def register(sub: Any) -> None:
    p = sub.add_parser(
        "chat",
        help="chat in the terminal, watching speculation work",
        description="A full-screen chat that shows speculative decoding live: which text the drafter guessed, "
        "acceptance, tokens per step and the speedup over plain decoding. Conversations are saved.",
    )
    add_model_argument(p)
    p.add_argument("--strategy", "-s", default="auto", help=f"auto (default), {STRATEGY_HELP}")
    p.add_argument("--system", type=arg_text, default="", help="system message")
    p.add_argument("--history-path", action="store_true", help="print where conversations are saved, then exit")
    add_model_options(p)
    add_sampling_options(p)
    p.set_defaults(handler=handle, max_tokens=1024)


def handle(args: argparse.Namespace) -> int:
    from localspec.tui.history import history_file

    load = load_options(args)  # a model named twice is refused before anything else
    if args.history_path:
        print(history_file())
        return 0
    from localspec.tui import ChatApp, ChatSettings
    from localspec.tui.models import load_runtime, missing_model

    settings = ChatSettings(
        load=load,
        system=args.system,
        sampling=sampling(args),
        max_tokens=args.max_tokens,
    )
    ChatApp(load_runtime, settings, missing_model=missing_model).run()
    return 0
