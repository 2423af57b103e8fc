"""Greedy identity on a llama.cpp GPU device: each strategy's tokens against plain decoding
(`none`) on the same device, the graph's argmax against the host's, and the CPU against the
device. Written for the Vulkan build on Mesa's software device (.ci/vulkan.sh), where it says
nothing about speed; it runs on any GPU build.

    GGML_VK_VISIBLE_DEVICES=0 python benchmarks/device_identity.py SMOLLM2.gguf [--tokens 32]

The drafter is a Q8_0 copy of the target (made once beside --work), on the device and on the
CPU. Prints one Markdown row per configuration: how many prompts gave exactly `none`'s tokens
and the first differing position where one did not.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from localspec.api import runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.backends.llamacpp.copies import derived
from localspec.backends.llamacpp.gpu import gpu_device
from localspec.core.protocol import Backend

PROMPTS = (
    "```python\ndef tally(items):\n    x = 0\n    for item in items:\n        if item:\n"
    "            x += 1\n    return x\n```\nAdd a docstring to this function. Reply with the full code.",
    "Summarize in one sentence: The city council met on Tuesday to discuss the new park. "
    "Residents asked for more trees and a playground. The council agreed to fund both next year.",
    "What is a good name for a pet goldfish?",
    "What is 17 multiplied by 23? Show your steps.",
    'Give a JSON object with keys "name" and "age" for a person called Alice who is 30. Output only JSON.',
)

Run = Callable[[str], list[int]]


def greedy(target: Backend, draft: Backend | None, strategy: str, gamma: int | str, tokens: int) -> Run:
    def run(prompt: str) -> list[int]:
        target.rollback(0)  # every run prefills its prompt in one block, as plain decoding's did
        if draft is not None:
            draft.rollback(0)
        runtime = runtime_for(target, draft, strategy=strategy, draft_tokens=gamma, calibrate=gamma == "auto")
        messages = [{"role": "user", "content": prompt}]
        return runtime.generate(messages=messages, max_tokens=tokens, temperature=0).tokens

    return run


def compare(label: str, run: Run, prompts: Sequence[str], plain: Sequence[list[int]]) -> str:
    same, parted = 0, []
    for prompt, reference in zip(prompts, plain, strict=True):
        out = run(prompt)
        if out == reference:
            same += 1
        else:
            pairs = enumerate(zip(out, reference, strict=False))
            parted.append(next((i for i, (a, b) in pairs if a != b), min(len(out), len(reference))))
    where = ", ".join(f"token {i}" for i in parted) or "-"
    row = f"| {label} | {same}/{len(prompts)} | {where} |"
    print(row, flush=True)
    return row


def host_argmax(target: Backend, run: Run) -> Run:
    """run with the graph's argmax off: the host reads each block's logits rows instead."""

    def without(prompt: str) -> list[int]:
        greedy_ = target._greedy  # type: ignore[attr-defined]
        greedy_.detach()
        greedy_.wanted = False
        try:
            return run(prompt)
        finally:
            greedy_.wanted = True

    return without


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first N prompts only")
    parser.add_argument("--work", default="/tmp/device-identity")
    args = parser.parse_args()
    device = gpu_device()
    assert device is not None, "no GPU device: a Vulkan build on lavapipe needs GGML_VK_VISIBLE_DEVICES=0"
    Path(args.work).mkdir(parents=True, exist_ok=True)
    q8 = str(derived(Path(args.model), "Q8_0", Path(args.work)))
    target = LlamaCppBackend(args.model, n_ctx=512, gpu_layers=99)
    on_device = LlamaCppBackend(q8, n_ctx=512, gpu_layers=99)
    on_cpu = LlamaCppBackend(q8, n_ctx=512, gpu_layers=0)
    cpu_target = LlamaCppBackend(args.model, n_ctx=512, gpu_layers=0)
    print(f"device: {device.name}; target {target.capabilities.extra.get('gpu')}; {args.tokens} tokens a prompt")
    assert target._greedy.wanted, "the output layer is not on the device"  # type: ignore[attr-defined]
    n = args.tokens
    prompts = PROMPTS[: args.prompts]
    plain = [greedy(target, None, "none", 0, n)(p) for p in prompts]
    print("| against `none` on the device | identical | first differing token |\n|---|---|---|")
    rows = [
        ("none, the host's argmax", host_argmax(target, greedy(target, None, "none", 0, n))),
        *((f"ngram γ {g}", greedy(target, None, "ngram", g, n)) for g in (4, 8, "auto")),
        *((f"draft γ {g}, drafter on the device", greedy(target, on_device, "draft", g, n)) for g in (4, 8, "auto")),
        ("draft γ 4, drafter on the CPU", greedy(target, on_cpu, "draft", 4, n)),
        ("ngram γ 4, the host's argmax", host_argmax(target, greedy(target, None, "ngram", 4, n))),
        ("draft γ 4, the host's argmax", host_argmax(target, greedy(target, on_device, "draft", 4, n))),
        ("none on the CPU (another device's kernels)", greedy(cpu_target, None, "none", 0, n)),
    ]
    for label, run in rows:
        compare(label, run, prompts, plain)
    for backend in (target, on_device, on_cpu, cpu_target):
        backend.close()


if __name__ == "__main__":
    main()
