"""Whether localspec's EAGLE-3 head drafts and accepts what llama.cpp's own draft-eagle3 does:
the tests' tiny targets (localspec/testing: a near-bigram llama, and a Qwen3.5-style hybrid)
with heads written for them (localspec/testing/eagle3_support.py: g weighing nothing, little,
as much as the token, or much; one with a d2t draft vocabulary), greedy, the same prompts and
fixed draft lengths through `llama-speculative-simple --spec-type draft-eagle3` and through
localspec's loop (ModelDrafter over the head, as the engine drafts); drafted and accepted tokens
side by side. Agreement, not speed: counts are the same on any host, timings are not taken.

p_min: llama.cpp stops a draft where the head's top token has less probability (default 0);
localspec's ModelDrafter stops where it has under min_confidence (0.3 by default). Both are run
at 0 and at 0.3.

    python benchmarks/eagle3_agreement.py [--peers-bin DIR]   # DIR: llama.cpp's build/bin
    (default: the folder `localspec bench --build-peers` builds, localspec.tooling.peers)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.core.acceptance import accept_greedy
from localspec.core.sampling import SamplingConfig
from localspec.drafters.model import ModelDrafter
from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
from localspec.testing.gguf_writer import HybridSpec, Spec, write_gguf, write_qwen35_gguf
from localspec.tooling.peers import find_or_build

LLAMA = Spec("llama", mix=0.02, head=1.0)
HYBRID = HybridSpec()
# (target, the name of its file's writer) -> the heads written for it
TARGETS: dict[str, tuple[Spec | HybridSpec, Callable[..., Path]]] = {
    "llama": (LLAMA, write_gguf),
    "hybrid": (HYBRID, write_qwen35_gguf),
}
HEADS = {
    "no g at all": HeadSpec(reads_g=False),
    "g zero (fc 0)": HeadSpec(fc=0.0),
    "g small (fc 0.05)": HeadSpec(),
    "g middle (fc 1.0)": HeadSpec(fc=1.0),
    "g large (fc 3.0)": HeadSpec(fc=3.0),
    "d2t, 200 tokens": HeadSpec(draft_vocab=200),
}
HYBRID_LAYERS = (0, 1, 3)
PROMPTS = ["the world and the world and the", "once upon a time there was", "def add(a, b):\n    return"]
N_PREDICT = 80
N_MAX = (4, 15)
P_MIN = (0.0, 0.3)


@dataclass
class Counts:
    drafted: int = 0
    accepted: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted

    def __str__(self) -> str:
        rate = self.accepted / self.drafted if self.drafted else 0.0
        return f"{self.accepted}/{self.drafted} ({rate:.3f})"


def ours(target_path: Path, head_path: Path, prompt: str, n_max: int, p_min: float) -> tuple[int, int]:
    """(drafted, accepted) of localspec's loop, run and counted as llama-speculative-simple runs
    draft-eagle3: the last prompt token goes with the first draft; n_max drafts a step, cut to
    what N_PREDICT leaves (but where it leaves none, the example's cap of 0 reads as no cap,
    and n_max are drafted)."""
    target = LlamaCppBackend(str(target_path), n_ctx=256, threads=1)
    drafter = ModelDrafter(target.eagle3_head(str(head_path)), min_confidence=p_min)
    cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    ctx = target.tokenize(prompt, add_special=True, parse_special=False)
    target.eval_block(ctx[:-1], "none")
    drafter.start(ctx)
    drafted = accepted = predicted = 0
    while predicted <= N_PREDICT:  # its stopping rule
        cap = N_PREDICT - predicted - 1
        draft = drafter.propose(ctx, min(n_max, cap) if cap > 0 else n_max, cfg, rng).tokens
        past = target.n_past
        kept, bonus = accept_greedy(draft, target.eval_block([ctx[-1], *draft], "all"))
        drafted, accepted, predicted = drafted + len(draft), accepted + kept, predicted + kept + 1
        ctx += [*draft[:kept], bonus]
        target.rollback(past + 1 + kept)
        drafter.commit(ctx, kept)
    target.close()
    return drafted, accepted


def theirs(bin_dir: Path, target_path: Path, head_path: Path, prompt: str, n_max: int, p_min: float) -> tuple[int, int]:
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(target_path), "-md", str(head_path)]
    cmd += ["--spec-type", "draft-eagle3", "--spec-draft-n-max", str(n_max), "--spec-draft-p-min", str(p_min)]
    cmd += ["-p", prompt, "-n", str(N_PREDICT), "--temp", "0", "-t", "1", "-c", "256"]
    for _ in range(3):  # llama.cpp's log thread may lose the last lines when the program exits
        # The random text is bytes, not UTF-8: decode it leniently.
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=True).stderr
        drafted, accepted = re.search(r"n_drafted\s*=\s*(\d+)", out), re.search(r"n_accept\s*=\s*(\d+)", out)
        if drafted and accepted:
            return int(drafted.group(1)), int(accepted.group(1))
    raise RuntimeError(f"llama-speculative-simple printed no counts:\n{out[-2000:]}")


def compare(bin_dir: Path, folder: Path, target_name: str) -> None:
    spec, write = TARGETS[target_name]
    target = write(spec, folder / f"{target_name}.gguf")
    print(f"\n{target_name} target, {len(PROMPTS)} prompts x {N_PREDICT} tokens, greedy, 1 thread")
    print(f"{'head':<20}{'n_max':<7}{'p_min':<7}{'llama.cpp accepted/drafted':<30}{'localspec accepted/drafted':<30}")
    for i, (name, head_spec) in enumerate(HEADS.items()):
        if target_name == "hybrid":
            head_spec = HeadSpec(**{**head_spec.__dict__, "layer_ids": HYBRID_LAYERS})
        head = write_eagle3_gguf(spec, head_spec, folder / f"eagle3-{target_name}-{i}.gguf")
        for n_max in N_MAX:
            for p_min in P_MIN:
                peer, mine = Counts(), Counts()
                for prompt in PROMPTS:
                    peer.add(*theirs(bin_dir, target, head, prompt, n_max, p_min))
                    mine.add(*ours(target, head, prompt, n_max, p_min))
                print(f"{name:<20}{n_max:<7}{p_min:<7}{peer!s:<30}{mine!s:<30}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers-bin", type=Path, help="llama.cpp's build/bin (default: localspec's peers folder)")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    args = parser.parse_args()
    bin_dir = find_or_build(args.peers_bin, programs=("llama-speculative-simple",))
    with tempfile.TemporaryDirectory() as folder:
        for target_name in args.targets:
            compare(bin_dir, Path(folder), target_name)


if __name__ == "__main__":
    main()
