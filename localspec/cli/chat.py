"""`localspec chat`: the full-screen terminal chat."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from localspec.cli.options import (
    DEFAULTS,
    add_model_argument,
    add_model_options,
    add_sampling_options,
    load_options,
    sampling,
)
from localspec.core.backend_loader import kind_of
from localspec.core.choices import STRATEGY_HELP
from localspec.core.errors import LocalspecError
from localspec.core.options import LoadOptions
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
    p.add_argument(
        "--new", action="store_true", help="start a new chat (default: reopen the last one; Ctrl+N starts one too)"
    )
    add_model_options(p)
    add_sampling_options(p, max_tokens=1024)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from localspec.tui.history import history_file

    load = load_options(args)  # a model named twice is refused before anything else
    from localspec.tui.settings import remembered

    load, temperature = with_remembered(args, load, remembered())
    if args.history_path:
        print(history_file())
        return 0
    from localspec.tui import ChatApp, ChatSettings
    from localspec.tui.models import load_runtime, missing_model

    settings = ChatSettings(
        load=load,
        system=args.system,
        sampling=replace(sampling(args), temperature=temperature),
        max_tokens=args.max_tokens,
    )
    app = ChatApp(load_runtime, settings, missing_model=missing_model, reopen_last=not args.new, remember_settings=True)
    app.run()
    return 0


def with_remembered(args: argparse.Namespace, load: LoadOptions, saved: dict[str, Any]) -> tuple[LoadOptions, float]:
    """The load options and temperature, each from the command line where it was given (not
    left at its default), else as the last chat left it."""
    changes = {}
    if load.model is None and load.draft_model is None and kind_of(load.backend).gguf:  # the chat remembers GGUF files
        given = ("model", "draft_model", "mmproj")
        changes = {k: saved[k] for k in given if saved.get(k) is not None and getattr(load, k) is None}
    for name, default in (("strategy", "auto"), ("draft_tokens", "auto")):
        if getattr(load, name) == default and name in saved:
            changes[name] = saved[name]
    temperature = args.temperature
    if temperature == DEFAULTS.temperature and isinstance(saved.get("temperature"), (int, float)):
        temperature = float(saved["temperature"])
    try:
        return load.changed(**changes), temperature
    except LocalspecError:
        return load, temperature  # settings saved by another version: the defaults do
