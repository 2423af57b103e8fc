"""Checks on what a user hands in (text, numbers from the command line), shared by the CLI,
the API and the chat, so hostile input is refused at the edge with a message, not a traceback."""

from __future__ import annotations

import argparse
import os
import sys

from localspec.errors import InvalidRequestError


def clean_text(text: str) -> str:
    """Text that encodes as UTF-8: bytes that were not UTF-8 (which Python carries as lone
    surrogates in argv, paths and stdin) become U+FFFD, as a text editor shows them."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = text.encode("utf-8", "replace")
        return raw.decode("utf-8", "replace")


def arg_text(value: str) -> str:
    """A command-line argument as text (argv holds undecodable bytes as surrogates)."""
    return clean_text(os.fsencode(value).decode("utf-8", "replace")) if value else value


def check_ctx(n_ctx: object) -> int:
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
        raise InvalidRequestError(
            f"the context length must be a whole number of 1 or more, got {n_ctx!r}",
            "use --ctx 4096 (the default), or leave it out",
        )
    return n_ctx


def check_threads(threads: object) -> int | None:
    """None or 0 mean "as many as the machine has physical cores"."""
    if threads is None or threads == 0:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise InvalidRequestError(
            f"threads must be a whole number of 1 or more, got {threads!r}",
            "leave --threads out (or give 0) to use every physical core",
        )
    return threads


def seed_value(seed: object) -> int | None:
    """A negative seed means "random", as in llama.cpp (--seed -1)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidRequestError(f"seed must be a whole number, got {seed!r}")
    return None if seed < 0 else seed


# argparse types: a bad value is reported by argparse as a usage error naming the option.


def ctx_arg(value: str) -> int:
    try:
        return check_ctx(int(value))
    except (ValueError, InvalidRequestError):
        raise argparse.ArgumentTypeError(f"expected a context length of 1 or more tokens, got {value!r}") from None


def threads_arg(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a thread count of 1 or more (0: all physical cores), got {value!r}")
    return n


def seed_arg(value: str) -> int | None:
    try:
        return seed_value(int(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number (-1: random), got {value!r}") from None


def read_stdin() -> str:
    """Standard input as text, whatever its bytes (undecodable ones become U+FFFD)."""
    return sys.stdin.buffer.read().decode("utf-8", "replace")
