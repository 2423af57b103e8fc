"""What the engine spends per step outside the target's pass, for plain decoding, n-gram
lookup and a draft model beside lookup, on one prompt: the controller's and drafters' share
of a step. On a prompt where nothing is drafted (the default's *chat* answer) the three do
the same passes, so the difference is the price of deciding not to draft. "ngram+memory"
searches a memory of earlier requests filled to capacity with the other suite prompts and
their answers, again and again: the most a step spends looking there.

    python benchmarks/step_overhead.py TARGET.gguf DRAFT.gguf [--prompt chat] [-r 5]
"""

from __future__ import annotations

import argparse
import statistics

from localspec.api import Runtime, runtime_for
from localspec.control.prompts import SUITE, BenchPrompt
from localspec.core.backend_loader import load_backend
from localspec.drafters.memory import CAPACITY, NgramMemory


def answered(runtime: Runtime, prompts: list[BenchPrompt]) -> list[list[int]]:
    """Each prompt's tokens followed by its greedy answer."""
    documents = []
    for p in prompts:
        answer = runtime.generate(messages=list(p.messages), max_tokens=160, temperature=0.0).tokens
        documents.append(runtime.prompt_tokens(messages=list(p.messages)) + answer)
    return documents


def full_memory(documents: list[list[int]]) -> NgramMemory:
    """A memory near capacity: the documents, cycled (each copy a document of its own)."""
    memory = NgramMemory()
    while len(memory) < CAPACITY * 0.9:
        for document in documents:
            memory.add(document)
    return memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("draft_model")
    parser.add_argument("--prompt", default="chat", choices=[p.id for p in SUITE])
    parser.add_argument("--repeats", "-r", type=int, default=5)
    args = parser.parse_args()
    target, draft = load_backend("llamacpp", args.model), load_backend("llamacpp", args.draft_model)
    prompt = next(p for p in SUITE if p.id == args.prompt)
    documents = answered(runtime_for(target, strategy="none"), [p for p in SUITE if p.id != args.prompt])
    runtimes = {
        "none": runtime_for(target, strategy="none"),
        "ngram": runtime_for(target, strategy="ngram"),
        "draft": runtime_for(target, draft, strategy="draft"),
    }
    names = ["none", "ngram", "ngram+memory", "draft"]
    outside: dict[str, list[float]] = {name: [] for name in names}
    passes: dict[str, list[float]] = {name: [] for name in names}
    drafted = dict.fromkeys(names, 0)
    for _ in range(args.repeats):
        # A fresh runtime each repeat: the memory as filled, without the answer it just added.
        runtimes["ngram+memory"] = runtime_for(target, strategy="ngram", memory=full_memory(documents))
        for name in names:  # interleaved, as the bench does
            runtime = runtimes[name]
            s = runtime.generate(messages=list(prompt.messages), max_tokens=160, temperature=0.0).stats
            outside[name].append((s.decode_seconds - s.verify_seconds) / s.verify_steps * 1e3)
            passes[name].append(s.verify_seconds / s.verify_steps * 1e3)
            drafted[name] += s.drafted
    for name in names:
        print(
            f"{name:<12} outside the pass {statistics.median(outside[name]):.3f} ms/step, "
            f"pass {statistics.median(passes[name]):.2f} ms/step, {drafted[name]} tokens drafted"
        )


if __name__ == "__main__":
    main()
