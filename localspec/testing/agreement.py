"""What benchmarks/eagle3_agreement.py and dspark_agreement.py share: a drafter that reads the
target drafted and verified by localspec's loop, run and counted as llama.cpp's
`llama-speculative-simple` runs its own (`--spec-type draft-eagle3`, `draft-dspark`), and that
program's counts on the same files. Agreement, not speed: counts are the same on any host."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.core.acceptance import accept_greedy
from localspec.core.drafting import Drafter
from localspec.core.sampling import SamplingConfig

PROMPTS = ["the world and the world and the", "once upon a time there was", "def add(a, b):\n    return"]
N_PREDICT = 80

# The drafter a run drafts with, opened over its target (a head, a DSpark block).
OpenDrafter = Callable[[LlamaCppBackend], Drafter]


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


def ours(target_path: Path, open_drafter: OpenDrafter, prompt: str, n_max: int) -> tuple[int, int]:
    """(drafted, accepted) of localspec's loop, run and counted as llama-speculative-simple runs
    a drafter: the last prompt token goes with the first draft; n_max drafts a step, cut to what
    N_PREDICT leaves (but where it leaves none, the example's cap of 0 reads as no cap, and
    n_max are drafted)."""
    target = LlamaCppBackend(str(target_path), n_ctx=256, threads=1)
    drafter = open_drafter(target)
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


@dataclass(frozen=True)
class Peer:
    """How llama-speculative-simple drafts one comparison's files."""

    bin_dir: Path
    spec_type: str  # draft-eagle3, draft-dspark
    p_min: float = 0.0


def theirs(peer: Peer, target_path: Path, drafter_path: Path, prompt: str, n_max: int) -> tuple[int, int]:
    """(drafted, accepted) that llama-speculative-simple prints for the same files and prompt."""
    cmd = [str(peer.bin_dir / "llama-speculative-simple"), "-m", str(target_path), "-md", str(drafter_path)]
    cmd += ["--spec-type", peer.spec_type, "--spec-draft-n-max", str(n_max), "--spec-draft-p-min", str(peer.p_min)]
    cmd += ["-p", prompt, "-n", str(N_PREDICT), "--temp", "0", "-t", "1", "-c", "256"]
    for _ in range(3):  # llama.cpp's log thread may lose the last lines when the program exits
        # The random text is bytes, not UTF-8: decode it leniently.
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=True).stderr
        drafted, accepted = re.search(r"n_drafted\s*=\s*(\d+)", out), re.search(r"n_accept\s*=\s*(\d+)", out)
        if drafted and accepted:
            return int(drafted.group(1)), int(accepted.group(1))
    raise RuntimeError(f"llama-speculative-simple printed no counts:\n{out[-2000:]}")


def side_by_side(
    peer: Peer, target_path: Path, drafter_path: Path, open_drafter: OpenDrafter, n_max: int
) -> tuple[Counts, Counts]:
    """llama.cpp's counts and localspec's over every prompt, at one draft length."""
    theirs_, ours_ = Counts(), Counts()
    for prompt in PROMPTS:
        theirs_.add(*theirs(peer, target_path, drafter_path, prompt, n_max))
        ours_.add(*ours(target_path, open_drafter, prompt, n_max))
    return theirs_, ours_
