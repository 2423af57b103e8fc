"""Whether localspec's DSpark drafter drafts and accepts what llama.cpp's own draft-dspark does:
the tests' tiny targets (localspec/testing: a near-bigram llama, and a Qwen3.5-style hybrid)
with DSpark drafters written for them (localspec/testing/dspark_support.py: DFlash's echoing
backbone and a Markov head that is the target's bigram, at a few strengths, anchor-first and
bonus-anchor), greedy, the same prompts and fixed draft lengths through
`llama-speculative-simple --spec-type draft-dspark` and through localspec's loop (the drafter's
propose and commit, as the engine drafts); drafted and accepted tokens side by side.
Agreement, not speed: counts are the same on any host, timings are not taken.

llama.cpp's p_min is 0 (its default: no confidence head is read) and n_min 0, so both sides
draft n_max a step, cut to the drafter's block and to what N_PREDICT leaves.

localspec's block pass always runs the trained block and reads the rows it drafts; llama.cpp's
runs n_max rows (and the anchor's, for a bonus-anchor drafter). The block's attention is not
causal, so a shorter pass gives other logits; --pass-at-draft-length runs localspec's at
llama.cpp's length, to tell that choice from any other difference.

    python benchmarks/dspark_agreement.py [--peers-bin DIR]   # DIR: llama.cpp's build/bin
    (default: the folder `localspec bench --build-peers` builds, localspec.tooling.peers)
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.backends.llamacpp.dspark import DSparkDrafter
from localspec.testing.agreement import N_PREDICT, PROMPTS, Peer, side_by_side
from localspec.testing.dflash_support import DFlashSpec
from localspec.testing.dspark_support import DSparkSpec, write_dspark_gguf
from localspec.testing.gguf_writer import HybridSpec, Spec, write_gguf, write_qwen35_gguf

BLOCK = 8
# target name -> (its spec, its file's writer, the layers its drafters read)
TARGETS: dict[str, tuple[Spec | HybridSpec, Callable[..., Path], tuple[int, int]]] = {
    "llama": (Spec("llama", mix=0.02, head=1.0), write_gguf, (1, 2)),
    "hybrid": (HybridSpec(), write_qwen35_gguf, (1, 3)),
}
DRAFTERS = {
    "markov 1.0, anchor-first": (1.0, True),
    "markov 0.3, anchor-first": (0.3, True),
    "markov 3.0, anchor-first": (3.0, True),
    "markov 1.0, bonus anchor": (1.0, False),
}
N_MAX = (4, BLOCK)


def block_drafter(drafter_path: Path, n_max: int, short: bool, target: LlamaCppBackend) -> DSparkDrafter:
    """localspec's DSpark drafter, its pass cut to llama.cpp's length where short (see the module doc)."""
    drafter = target.dspark_drafter(str(drafter_path))
    if short:  # llama.cpp's pass: the draft's rows only
        drafter.block = min(drafter.block, n_max + drafter.first_row)
    return drafter


def compare(bin_dir: Path, folder: Path, target_name: str, short: bool) -> None:
    spec, write, layers = TARGETS[target_name]
    target = write(spec, folder / f"{target_name}.gguf")
    print(f"\n{target_name} target, {len(PROMPTS)} prompts x {N_PREDICT} tokens, greedy, 1 thread, block {BLOCK}")
    print(f"{'drafter':<28}{'n_max':<7}{'llama.cpp accepted/drafted':<30}{'localspec accepted/drafted':<30}")
    for i, (name, (markov, anchor)) in enumerate(DRAFTERS.items()):
        drafter_spec = DSparkSpec(DFlashSpec(target_layers=layers, block_size=BLOCK), markov, anchor)
        drafter = write_dspark_gguf(target, folder / f"dspark-{target_name}-{i}.gguf", drafter_spec)
        for n_max in N_MAX:
            peer = Peer(bin_dir, "draft-dspark")
            opened = partial(block_drafter, drafter, n_max, short)
            theirs, mine = side_by_side(peer, target, drafter, opened, n_max)
            print(f"{name:<28}{n_max:<7}{theirs!s:<30}{mine!s:<30}", flush=True)


def main() -> None:
    from localspec.tooling.peers import find_or_build

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers-bin", type=Path, help="llama.cpp's build/bin (default: localspec's peers folder)")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--pass-at-draft-length", action="store_true", help="localspec's pass at llama.cpp's length")
    args = parser.parse_args()
    bin_dir = find_or_build(args.peers_bin, programs=("llama-speculative-simple",))
    with tempfile.TemporaryDirectory() as folder:
        for target_name in args.targets:
            compare(bin_dir, Path(folder), target_name, args.pass_at_draft_length)


if __name__ == "__main__":
    main()
