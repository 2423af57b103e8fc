"""Greedy identity on a llama.cpp GPU device: each strategy's tokens against plain decoding
(`none`) on the same device, the graph's argmax against the host's, and the CPU against the
device. Written for the Vulkan build on Mesa's software device (.ci/vulkan.sh), where it says
nothing about speed; it runs on any GPU build.

    GGML_VK_VISIBLE_DEVICES=0 python benchmarks/device_identity.py --tiny [--tokens 40]
    GGML_VK_VISIBLE_DEVICES=0 python benchmarks/device_identity.py SMOLLM2.gguf [--tokens 32]

--tiny: the tests' tiny random models (localspec/testing), written under --work: a dense llama
target with a noisy copy as its drafter, an EAGLE-3 head and a DFlash drafter, and a hybrid
(recurrent) qwen35 target with its own MTP block, a noisy copy, an EAGLE-3 head and a DFlash
drafter. Every row of issue #60's table, in minutes on lavapipe. With a model instead: that
model, its Q8_0 copy as the drafter (made once beside --work), on the device and on the CPU.
Prints one Markdown row per configuration: how many prompts gave exactly `none`'s tokens, the
first differing position where one did not, and the tokens drafted and accepted (a rejected
draft is a rollback of the device's cache).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from localspec.api import runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.backends.llamacpp.copies import derived
from localspec.backends.llamacpp.gpu import gpu_device
from localspec.core.protocol import Backend
from localspec.runtime import Runtime

PROMPTS = (
    "```python\ndef tally(items):\n    x = 0\n    for item in items:\n        if item:\n"
    "            x += 1\n    return x\n```\nAdd a docstring to this function. Reply with the full code.",
    "Summarize in one sentence: The city council met on Tuesday to discuss the new park. "
    "Residents asked for more trees and a playground. The council agreed to fund both next year.",
    "What is a good name for a pet goldfish?",
    "What is 17 multiplied by 23? Show your steps.",
    'Give a JSON object with keys "name" and "age" for a person called Alice who is 30. Output only JSON.',
)
# The tiny models' byte-level vocabulary takes any text; these repeat, so n-gram drafts too.
TINY_PROMPTS = (
    "the world and the world and the",
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return",
    "one two three one two three one",
)


@dataclass
class Outcome:
    tokens: list[int]
    drafted: int = 0
    accepted: int = 0
    reused: int = 0  # cached prompt tokens the request kept (prefix reuse)


Prompt = str | list[int]
VOCAB = 320
Run = Callable[[Prompt], Outcome]


def greedy(target: Backend, make: Callable[[], Runtime], tokens: int, chat: bool = False) -> Run:
    """Each prompt from an empty cache (prefilled in one block, as plain decoding's was)."""

    def run(prompt: Prompt) -> Outcome:
        target.rollback(0)
        runtime = make()
        if chat:
            result = runtime.generate(messages=[{"role": "user", "content": prompt}], max_tokens=tokens, temperature=0)
        else:
            result = runtime.generate(prompt=prompt, max_tokens=tokens, temperature=0)
        return Outcome(result.tokens, result.stats.drafted, result.stats.accepted)

    return run


Drafter = Callable[[], Any]  # the drafter, loaded or attached (a head) on first use


def strategy(target: Backend, name: str, gamma: int | str, drafter: Drafter | None = None) -> Callable[[], Runtime]:
    """A Runtime maker, called once per prompt."""

    def make() -> Runtime:
        draft = drafter() if drafter is not None else None
        calibrate = gamma == "auto"
        if name == "dflash":
            return runtime_for(target, strategy="dflash", block=draft, draft_tokens=gamma, calibrate=calibrate)
        return runtime_for(target, draft, strategy=name, draft_tokens=gamma, calibrate=calibrate)

    return make


def compare(label: str, run: Run, prompts: Sequence[Prompt], plain: Sequence[list[int]]) -> str:
    same, parted, drafted, accepted, reused = 0, [], 0, 0, 0
    for prompt, reference in zip(prompts, plain, strict=True):
        out = run(prompt)
        drafted, accepted, reused = drafted + out.drafted, accepted + out.accepted, reused + out.reused
        if out.tokens == reference:
            same += 1
        else:
            pairs = enumerate(zip(out.tokens, reference, strict=False))
            parted.append(next((i for i, (a, b) in pairs if a != b), min(len(out.tokens), len(reference))))
    where = ", ".join(f"token {i}" for i in parted) or "-"
    kept = f"; {reused} prompt tokens reused" if reused else ""
    row = f"| {label} | {same}/{len(prompts)} | {where} | {drafted} / {accepted}{kept} |"
    print(row, flush=True)
    return row


def host_argmax(target: Backend, run: Run) -> Run:
    """run with the graph's argmax off: the host reads each block's logits rows instead."""

    def without(prompt: Prompt) -> Outcome:
        greedy_ = target._greedy  # type: ignore[attr-defined]
        greedy_.detach()
        greedy_.wanted = False
        try:
            return run(prompt)
        finally:
            greedy_.wanted = True

    return without


def warm_prefix(target: Backend, make: Callable[[], Runtime], tokens: int) -> Run:
    """Prefix reuse: the prompt's first half answered first, then the whole prompt on that warm
    cache (the engine keeps the cached rows the two share); `none` ran it from an empty cache."""

    def run(prompt: Prompt) -> Outcome:
        assert isinstance(prompt, list)
        target.rollback(0)
        make().generate(prompt=prompt[: len(prompt) // 2], max_tokens=4, temperature=0)
        result = make().generate(prompt=prompt, max_tokens=tokens, temperature=0)
        stats = result.stats
        return Outcome(result.tokens, stats.drafted, stats.accepted, stats.reused_tokens)

    return run


def print_header(title: str) -> None:
    print(f"\n{title}\n\n| against `none` on the device | identical | first differing token | drafted / accepted |")
    print("|---|---|---|---|", flush=True)


class Loads:
    """Backends loaded on the device (gpu_layers 99) or the CPU (0), closed together."""

    def __init__(self, n_ctx: int) -> None:
        self.n_ctx, self.opened = n_ctx, list[LlamaCppBackend]()

    def __call__(self, path: Path | str, gpu_layers: int = 99) -> LlamaCppBackend:
        backend = LlamaCppBackend(str(path), n_ctx=self.n_ctx, gpu_layers=gpu_layers)
        self.opened.append(backend)
        return backend

    def close(self) -> None:
        for backend in reversed(self.opened):
            backend.close()


@dataclass(frozen=True)
class TinyFiles:
    target: Path
    drafter: Path  # a noisy copy of the target
    eagle3: Path | None = None
    dflash: Path | None = None
    every_row: bool = True  # False: its own drafter's rows only (the other rows are another target's)


def write_tiny(work: Path) -> dict[str, TinyFiles]:
    from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf
    from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
    from localspec.testing.gguf_writer import HybridSpec, Spec, write_gguf, write_qwen35_gguf

    # 320 tokens, 1,280 bytes a row: the graph's argmax can view every row (greedy.rows_aligned).
    dense, hybrid = Spec("llama", mix=0.02, head=1.0, vocab=VOCAB), HybridSpec(vocab=VOCAB)
    mtp = HybridSpec(nextn=1, mtp_echo=1.0, vocab=VOCAB)
    llama = write_gguf(dense, work / "llama.gguf")
    qwen35 = write_qwen35_gguf(hybrid, work / "qwen35.gguf")
    return {
        "dense llama": TinyFiles(
            llama,
            write_gguf(Spec("llama", mix=0.02, head=1.0, noise=0.3, vocab=VOCAB), work / "llama-drafter.gguf"),
            write_eagle3_gguf(dense, HeadSpec(), work / "llama-eagle3.gguf"),
            write_dflash_gguf(llama, work / "llama-dflash.gguf", DFlashSpec(target_layers=(1, 2))),
        ),
        "hybrid qwen35 (recurrent)": TinyFiles(
            qwen35,
            write_qwen35_gguf(HybridSpec(noise=0.3, vocab=VOCAB), work / "qwen35-drafter.gguf"),
            write_eagle3_gguf(hybrid, HeadSpec(layer_ids=(0, 1, 3)), work / "qwen35-eagle3.gguf"),
            write_dflash_gguf(qwen35, work / "qwen35-dflash.gguf", DFlashSpec(target_layers=(1, 3))),
        ),
        "hybrid qwen35 with its MTP block": TinyFiles(
            write_qwen35_gguf(mtp, work / "qwen35-mtp.gguf"),
            write_qwen35_gguf(
                HybridSpec(nextn=1, mtp_echo=1.0, noise=0.3, vocab=VOCAB), work / "qwen35-mtp-drafter.gguf"
            ),
            every_row=False,
        ),
    }


def tiny_rows(files: TinyFiles, load: Loads, target: LlamaCppBackend, n: int) -> list[tuple[str, Run]]:
    """Every row for one tiny target; a head gets a target of its own (a head keeps the
    target's outputs whole, which turns the graph's argmax off for that context)."""

    def run(name: str, gamma: int | str, drafter: Callable[[], Any] | None = None, on: Backend = target) -> Run:
        return greedy(on, strategy(on, name, gamma, drafter), n)

    def headed(attach: Callable[[LlamaCppBackend], Any], name: str, gamma: int) -> Run:
        fresh = load(files.target)
        return run(name, gamma, cache(lambda: attach(fresh)), fresh)

    on_device = cache(lambda: load(files.drafter))
    on_cpu = cache(lambda: load(files.drafter, 0))
    rows: list[tuple[str, Run]] = [
        ("none, the host's argmax instead of the graph's", host_argmax(target, run("none", 0))),
        *((f"ngram γ {g}", run("ngram", g)) for g in (4, 8, "auto")),
        *((f"draft γ {g}, drafter on the device", run("draft", g, on_device)) for g in (4, 8, "auto")),
        ("draft γ 4, drafter on the CPU", run("draft", 4, on_cpu)),
        ("ngram γ 4, the host's argmax", host_argmax(target, run("ngram", 4))),
        ("draft γ 4, the host's argmax", host_argmax(target, run("draft", 4, on_device))),
        ("prefix reuse: none on a warm cache", warm_prefix(target, strategy(target, "none", 0), n)),
        ("prefix reuse: ngram γ 4 on a warm cache", warm_prefix(target, strategy(target, "ngram", 4), n)),
    ]
    if not files.every_row:
        rows = rows[:1]
    if files.eagle3 is not None:
        head = str(files.eagle3)
        rows += [(f"EAGLE-3 head γ {g}", headed(lambda t: t.eagle3_head(head), "draft", g)) for g in (3, 8)]
    if files.dflash is not None:
        block = str(files.dflash)
        rows += [(f"DFlash γ {g}", headed(lambda t: t.dflash_drafter(block), "dflash", g)) for g in (3, 15)]
    if target.capabilities.extra.get("mtp_layers"):
        rows += [(f"MTP head γ {g}", headed(lambda t: t.mtp_head(), "draft", g)) for g in (2, 4)]
    rows.append(("none on the CPU (another device's kernels)", run("none", 0, on=load(files.target, 0))))
    return rows


def tiny_tables(work: Path, tokens: int) -> None:
    for title, files in write_tiny(work).items():
        load = Loads(n_ctx=256)
        try:
            target = load(files.target)
            assert target._greedy.wanted, "the output layer is not on the device"  # type: ignore[attr-defined]
            prompts: list[Prompt] = [runtime_for(target, strategy="none").prompt_tokens(p) for p in TINY_PROMPTS]
            plain = [greedy(target, strategy(target, "none", 0), tokens)(p).tokens for p in prompts]
            print_header(f"{title} ({target.capabilities.extra.get('gpu')}; {tokens} tokens a prompt)")
            for label, run in tiny_rows(files, load, target, tokens):
                compare(label, run, prompts, plain)
        finally:
            load.close()


def smollm2_table(model: str, work: Path, tokens: int, count: int) -> None:
    q8 = str(derived(Path(model), "Q8_0", work))
    load = Loads(n_ctx=512)
    try:
        target, on_device, on_cpu, cpu_target = load(model), load(q8), load(q8, 0), load(model, 0)
        assert target._greedy.wanted, "the output layer is not on the device"  # type: ignore[attr-defined]
        n, prompts = tokens, list(PROMPTS[:count])

        def run(on: Backend, name: str, gamma: int | str, drafter: Backend | None = None) -> Run:
            return greedy(on, strategy(on, name, gamma, None if drafter is None else lambda: drafter), n, chat=True)

        plain = [run(target, "none", 0)(p).tokens for p in prompts]
        print_header(f"{Path(model).name} ({target.capabilities.extra.get('gpu')}; {n} tokens a prompt)")
        rows = [
            ("none, the host's argmax", host_argmax(target, run(target, "none", 0))),
            *((f"ngram γ {g}", run(target, "ngram", g)) for g in (4, 8, "auto")),
            *((f"draft γ {g}, drafter on the device", run(target, "draft", g, on_device)) for g in (4, 8, "auto")),
            ("draft γ 4, drafter on the CPU", run(target, "draft", 4, on_cpu)),
            ("ngram γ 4, the host's argmax", host_argmax(target, run(target, "ngram", 4))),
            ("draft γ 4, the host's argmax", host_argmax(target, run(target, "draft", 4, on_device))),
            ("none on the CPU (another device's kernels)", run(cpu_target, "none", 0)),
        ]
        for label, row in rows:
            compare(label, row, prompts, plain)
    finally:
        load.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("model", nargs="?", help="a GGUF (SmolLM2); leave out with --tiny")
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny models, every row")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first N prompts only")
    parser.add_argument("--work", default="/tmp/device-identity")
    args = parser.parse_args()
    device = gpu_device()
    assert device is not None, "no GPU device: a Vulkan build on lavapipe needs GGML_VK_VISIBLE_DEVICES=0"
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"device: {device.name}")
    if args.tiny:
        tiny_tables(work, args.tokens)
    if args.model:
        smollm2_table(args.model, work, args.tokens, args.prompts)


if __name__ == "__main__":
    main()
