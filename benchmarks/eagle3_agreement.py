"""Whether localspec's EAGLE-3 head drafts what llama.cpp's own draft-eagle3 drafts: the tests'
tiny target and heads (localspec/testing/eagle3_support.py: a near-bigram llama target, heads whose g
weighs little or much, one with a d2t draft vocabulary), greedy, the same prompt and fixed
draft length through llama-speculative-simple and through localspec's loop; drafted and
accepted tokens side by side. Agreement, not speed.

    python benchmarks/eagle3_agreement.py --peers-bin DIR     # DIR: llama.cpp's build/bin
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.core.acceptance import accept_greedy
from localspec.core.sampling import SamplingConfig
from localspec.drafters.model import ModelDrafter
from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
from localspec.testing.gguf_writer import Spec, write_gguf

TARGET = Spec("llama", mix=0.02, head=1.0)
HEADS = {
    "g small (fc 0.05)": HeadSpec(),
    "g large (fc 3.0)": HeadSpec(fc=3.0),
    "d2t, 200 tokens": HeadSpec(draft_vocab=200),
}
PROMPT = "the world and the world and the"
N_PREDICT = 80


def ours(target_path: Path, head_path: Path, n_max: int) -> tuple[int, int]:
    """(drafted, accepted) of localspec's loop: n_max drafts a step, no early stop, greedy."""
    target = LlamaCppBackend(str(target_path), n_ctx=256, threads=1)
    drafter = ModelDrafter(target.eagle3_head(str(head_path)), min_confidence=0)
    cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    ctx = target.tokenize(PROMPT, add_special=True, parse_special=False)
    target.eval_block(ctx[:-1], "none")  # as llama-speculative-simple: the last token goes with the first draft
    drafter.start(ctx)
    drafted = accepted = predicted = 0
    while predicted <= N_PREDICT:  # its stopping rule and its cap on the last drafts
        n = max(0, min(n_max, N_PREDICT - predicted - 1))
        draft = drafter.propose(ctx, n, cfg, rng).tokens if n else []
        past = target.n_past
        kept, bonus = accept_greedy(draft, target.eval_block([ctx[-1], *draft], "all"))
        drafted, accepted, predicted = drafted + len(draft), accepted + kept, predicted + kept + 1
        ctx += [*draft[:kept], bonus]
        target.rollback(past + 1 + kept)
        drafter.commit(ctx, kept)
    target.close()
    return drafted, accepted


def theirs(bin_dir: Path, target_path: Path, head_path: Path, n_max: int) -> tuple[int, int]:
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(target_path), "-md", str(head_path)]
    cmd += ["--spec-type", "draft-eagle3", "--spec-draft-n-max", str(n_max), "-p", PROMPT, "-n", str(N_PREDICT)]
    cmd += ["--temp", "0", "-t", "1", "-c", "256"]
    # The random text is bytes, not UTF-8: decode it leniently.
    out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=True).stderr
    drafted, accepted = re.search(r"n_drafted\s*=\s*(\d+)", out), re.search(r"n_accept\s*=\s*(\d+)", out)
    assert drafted and accepted, out[-2000:]
    return int(drafted.group(1)), int(accepted.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers-bin", type=Path, required=True, help="llama.cpp's build/bin")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        target = write_gguf(TARGET, Path(folder) / "target.gguf")
        print("head                n-max  llama.cpp drafted/accepted  localspec drafted/accepted")
        for i, (name, spec) in enumerate(HEADS.items()):
            head = write_eagle3_gguf(TARGET, spec, Path(folder) / f"eagle3-{i}.gguf")
            for n_max in (2, 5):
                d1, a1 = theirs(args.peers_bin, target, head, n_max)
                d2, a2 = ours(target, head, n_max)
                print(f"{name:<20}{n_max:<7}{f'{d1}/{a1}':<28}{d2}/{a2}")


if __name__ == "__main__":
    main()
