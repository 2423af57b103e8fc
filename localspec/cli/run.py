"""`localspec run`: one answer on stdout, streamed; statistics on stderr with --verbose."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from localspec.api import Finished, TextDelta, load
from localspec.cli.options import add_model_options, add_sampling_options, load_options, sampling
from localspec.common.media import AUDIO_FORMATS, file_part
from localspec.common.progress import Steps, announced
from localspec.control.contention import threads_notice
from localspec.core.choices import STRATEGY_HELP
from localspec.core.errors import InvalidRequestError
from localspec.core.validate import arg_text, piped_stdin, read_stdin

Event = TextDelta | Finished


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="answer one prompt", description="Answer one prompt with speculative decoding.")
    p.add_argument(
        "prompt",
        type=arg_text,
        help="the prompt; '-' reads it from standard input; text piped in beside a prompt follows it "
        '(echo hello | localspec run "Translate to French:")',
    )
    p.add_argument(
        "--strategy",
        "-s",
        default="auto",
        help=f"{STRATEGY_HELP}; auto (default): 'draft' when --draft-model is given, else 'ngram'",
    )
    p.add_argument("--system", type=arg_text, help="system message")
    p.add_argument("--raw", action="store_true", help="continue the text as is, without the chat template")
    p.add_argument(
        "--image",
        metavar="PATH",
        action="append",
        default=[],
        help="an image the prompt is about, before its text (repeatable; needs the model's --mmproj)",
    )
    p.add_argument(
        "--audio",
        metavar="PATH",
        action="append",
        default=[],
        help="a WAV or MP3 clip the prompt is about, before its text (repeatable; needs a projector "
        "with an audio encoder as --mmproj)",
    )
    p.add_argument("--stop", type=arg_text, action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--verbose", "-v", action="store_true", help="print statistics on stderr")
    p.add_argument("--json", action="store_true", help="print the answer and statistics as one JSON object")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument(
        "--json-schema", metavar="FILE", help="constrain the answer to JSON valid for the JSON schema in FILE"
    )
    shape.add_argument("--json-object", action="store_true", help="constrain the answer to a JSON object")
    add_model_options(p)
    add_sampling_options(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    prompt = read_stdin() if args.prompt == "-" else joined_with_piped(args.prompt, piped_stdin())
    if not prompt.strip():
        raise InvalidRequestError("the prompt is empty", 'give some text: localspec run "Why is the sky blue?"')
    if (args.image or args.audio) and args.raw:
        raise InvalidRequestError("--image and --audio go into a chat message", "drop --raw")
    # Read before a model is loaded for them: a missing file is refused at once.
    images = [file_part(path, "image", "check the path given to --image") for path in args.image]
    images += [audio_file(path) for path in args.audio]
    config = sampling(args)  # refused before a model is loaded for it
    schema = read_schema(args.json_schema) if args.json_schema else None
    progress = Steps("localspec:")
    try:
        runtime = load(load_options(args), on_progress=progress.say)
    finally:
        progress.close()
    if (busy := threads_notice(runtime.target.capabilities, "pass --threads 1")) is not None:
        print(f"localspec: note: {busy}", file=sys.stderr)
    if args.raw:
        request: dict[str, Any] = {"prompt": prompt}
    else:
        content: str | list[dict[str, Any]] = [*images, {"type": "text", "text": prompt}] if images else prompt
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": content}
        ]
        request = {"messages": messages}
    with runtime:
        if args.json_object:
            request["response_format"] = {"type": "json_object"}
        events = runtime.stream(
            **request, max_tokens=args.max_tokens, stop=args.stop, sampling=config, json_schema=schema
        )
        for event in first_token_announced(events, progress):
            if isinstance(event, TextDelta):
                if not args.json:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
            elif isinstance(event, Finished):
                if args.json:
                    print(
                        json.dumps(
                            {"text": event.text, "finish_reason": event.finish_reason, "stats": event.stats.to_dict()}
                        )
                    )
                else:
                    sys.stdout.write("\n")
                if args.verbose:
                    print(event.stats.summary(), file=sys.stderr)
                    decision = runtime.policy.explain()  # the last step's
                    if decision is not None:
                        print(f"last step's {decision.table()}", file=sys.stderr)
                note = runtime.idle_drafter_note(event.stats)
                if note:  # the drafter asked for did nothing: say why, even without --verbose
                    print(f"localspec: {note}", file=sys.stderr)
    return 0


def audio_file(path: str) -> dict[str, Any]:
    """--audio's part: the file read now, refused unless its bytes are a clip."""
    part = file_part(path, "clip", "check the path given to --audio")
    if part["type"] != "input_audio":
        raise InvalidRequestError(f"{path} is not audio localspec reads", f"give a {AUDIO_FORMATS} file to --audio")
    return part


def joined_with_piped(prompt: str, piped: str | None) -> str:
    """The prompt, then the text piped in after a blank line (as `llm` joins them)."""
    if piped is None or not piped.strip():
        return prompt
    return f"{prompt}\n\n{piped.strip()}"


def first_token_announced(events: Iterator[Event], progress: Steps) -> Iterator[Event]:
    """The events, saying on stderr what the wait for the first one is (reading the prompt, and
    on a busy machine the first steps) once it has lasted two seconds."""
    try:
        with announced("reading the prompt, then writing the first words", progress.say):
            first = next(events, None)
    finally:
        progress.close()
    if first is not None:
        yield first
        yield from events


def read_schema(path: str) -> dict[str, Any]:
    """The JSON schema in a file, read before a model is loaded for it."""
    try:
        with open(path, encoding="utf-8") as file:
            schema = json.load(file)
    except FileNotFoundError:
        raise InvalidRequestError(f"no JSON schema file at {path}", "check the path given to --json-schema") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"cannot read the JSON schema file {path}: {exc}") from None
    except ValueError as exc:
        raise InvalidRequestError(
            f"{path} is not JSON: {exc}", 'write the schema as a JSON object, e.g. {"type": "object"}'
        ) from None
    if not isinstance(schema, dict):
        raise InvalidRequestError(
            f"the JSON schema in {path} is a {type(schema).__name__}, not an object",
            'write the schema as a JSON object, e.g. {"type": "object"}',
        )
    return schema
