"""What verifying trees would buy: the golden replays (tests/data/replay_answers.json on every
curve of tests/data/replay_curves.json, localspec/control/tree_replay.py) with n-gram chains
only, with the controller pricing the lookup's second continuation per step, and with every
branch verified; then, with a model, the pass costs on this CPU of trees of 4-22 nodes beside
chains of as many tokens (the tree pricing's assumption: a pass costs by its node count).

    python benchmarks/tree_replay.py [MODEL.gguf] [--reps 30] [--threads 1]
    python benchmarks/tree_replay.py --heads   # a simulated head's top-2 (an EAGLE-3 head's) instead

--heads replays a head that reads the target's layers (tree_replay.GuessingHead, HeadModel's
defaults: right 60 % of the time until its first miss, its runner-up right 40 % of the times
it misses, a guess 5 % of a target step) with chains only, with trees priced where a kept
branch costs a pass of its own (llama.cpp before #58 wherever a drafter read its layers), with
trees priced where it rides on the next pass, and with every branch verified.

Pass costs: each size's chain block and tree pass are timed alternately behind the same
context (512 tokens), so load drifts alike on both; the ratio of medians is the figure. The
time is the process's CPU time with one thread: on a host shared with other work, wall time
with two threads measures the scheduler (a pass waits for its second thread).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from localspec.control.replay import Truth, calibration_from_doctor
from localspec.control.tree_replay import HeadModel, replay_head_tree, replay_tree

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
NODES = (4, 6, 8, 12, 16, 22)
DEPTH = 512


TARGETS = {
    (False, False): "a kept branch kept in place",
    (True, False): "a kept branch evaluated again in a pass of its own (llama.cpp before)",
    (True, True): "a kept branch evaluated again at the head of the next pass (llama.cpp, folded)",
}


def replays(repass: bool, fold: bool = False) -> None:
    """repass: the target evaluates a kept branch again (llama.cpp's keep_branch); fold: with
    the next pass rather than in one of its own."""
    answers = json.loads((DATA / "replay_answers.json").read_text())
    curves = json.loads((DATA / "replay_curves.json").read_text())
    print(f"\n{TARGETS[(repass, fold)]}:")
    print("curve | chains | priced trees | every branch | tree steps (priced) | branch taken")
    print("--- | --- | --- | --- | --- | ---")
    for name, report in curves.items():
        cal = calibration_from_doctor(report)
        truth = Truth.of(cal)
        row = []
        for mode in ("chain", "priced", "always"):
            plain = seconds = 0.0
            trees = taken = steps = 0
            for rec in answers["answers"].values():
                prompt, answer = list(rec["prompt"]), list(rec["answer"])
                run = replay_tree(prompt, answer, cal, answers["n_vocab"], mode, repass, fold)
                plain, seconds = plain + truth.plain(prompt, answer), seconds + run.seconds
                trees, taken, steps = trees + run.trees, taken + run.taken, steps + run.steps
            row.append((plain / seconds, trees, taken, steps))
        (chain, *_), (priced, trees, taken, steps), (every, *_) = row
        print(f"{name} | {chain:.3f}x | {priced:.3f}x | {every:.3f}x | {trees}/{steps} | {taken}")


def head_replays() -> None:
    answers = json.loads((DATA / "replay_answers.json").read_text())
    curves = json.loads((DATA / "replay_curves.json").read_text())
    print(f"\na simulated head's top-2 ({HeadModel()}):")
    print("curve | chains | priced, a pass of its own | priced, folded | every branch | tree steps (folded) | taken")
    print("--- | --- | --- | --- | --- | --- | ---")
    for name, report in curves.items():
        cal = calibration_from_doctor(report)
        truth = Truth.of(cal)
        row = []
        for mode, fold in (("chain", True), ("priced", False), ("priced", True), ("always", True)):
            plain = seconds = 0.0
            trees = taken = steps = 0
            for rec in answers["answers"].values():
                prompt, answer = list(rec["prompt"]), list(rec["answer"])
                run = replay_head_tree(prompt, answer, cal, answers["n_vocab"], HeadModel(), mode, True, fold)
                plain, seconds = plain + truth.plain(prompt, answer), seconds + run.seconds
                trees, taken, steps = trees + run.trees, taken + run.taken, steps + run.steps
            row.append((plain / seconds, trees, taken, steps))
        (chain, *_), (alone, *_), (folded, trees, taken, steps), (every, *_) = row
        print(f"{name} | {chain:.3f}x | {alone:.3f}x | {folded:.3f}x | {every:.3f}x | {trees}/{steps} | {taken}")


def tree_of(nodes: int) -> list[int]:
    """A DDTree-like shape of `nodes` guessed tokens: a chain of half of them, the rest as
    branches of two tokens hanging from its first positions (parents in pass order, root 0)."""
    chain = (nodes + 1) // 2
    parents = [-1, *range(chain)]
    depth = 0
    while len(parents) < nodes + 1:
        parents.append(depth)  # a branch beside chain token depth+1
        if len(parents) < nodes + 1:
            parents.append(len(parents) - 1)
        depth += 1
    return parents


def pass_costs(model: str, reps: int, threads: int) -> None:
    from localspec.backends.llamacpp.backend import LlamaCppBackend

    backend = LlamaCppBackend(model, n_ctx=1024, threads=threads)
    context = [(i * 37) % 1000 + 10 for i in range(DEPTH)]
    backend.eval_block(context, "none")
    print(f"\npass costs behind {DEPTH} tokens, {threads} thread(s), process CPU time, median of {reps}:")
    print("nodes | chain of nodes+1 tokens | tree of nodes (+ pending) | tree / chain | branches")
    print("--- | --- | --- | --- | ---")
    for nodes in NODES:
        parents = tree_of(nodes)
        tokens = [(i * 53) % 1000 + 10 for i in range(nodes + 1)]
        chain_t, tree_t = [], []
        for _ in range(reps):
            t0 = time.process_time()
            backend.eval_block(tokens, "all")
            chain_t.append(time.process_time() - t0)
            backend.rollback(DEPTH)
            t0 = time.process_time()
            backend.eval_tree(tokens, parents)
            backend.keep_branch([0])
            tree_t.append(time.process_time() - t0)
            backend.rollback(DEPTH)
        c, t = statistics.median(chain_t) * 1e3, statistics.median(tree_t) * 1e3
        leaves = nodes + 1 - sum(1 for p in set(parents) if p >= 0)
        print(f"{nodes} | {c:.2f} ms | {t:.2f} ms | {t / c:.3f} | {leaves}")
    backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="a GGUF for the pass costs (none: the replays only)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--heads", action="store_true", help="replay a simulated head's top-2 trees only")
    args = parser.parse_args()
    if args.heads:
        head_replays()
        return
    replays(repass=False)
    replays(repass=True)
    replays(repass=True, fold=True)
    if args.model:
        pass_costs(args.model, args.reps, args.threads)


if __name__ == "__main__":
    main()
