"""Replays the bench suite's answers through the real engine, drafter and controller with a
simulated target: every verify pass "costs" the model's calibrated t_verify(k) on a
simulated clock, plus llama.cpp's graph rebuild (also calibrated) when its size differs
from the pass before, and the target's choice is the recorded answer. A drafter or controller
change can then be judged on every prompt in a second, without timing noise; the real bench
(`localspec bench`) confirms what this suggests.

    python benchmarks/replay_drafters.py MODEL.gguf [--tokens 160] [--fixed 4] [-t 0.8 --seeds 3]
        [--curve DOCTOR.json]

--curve prices the same answers on a cost curve that `localspec doctor --json` measured on
another machine: what the controller and the ceiling would make of them there.

--prior adds a column for a first run on a model never seen: the controller starts from the
prior (the roofline of this machine's, or the --curve report's, bandwidth and compute; no
calibration) and learns the curve from the simulated passes, which the curve prices.

The answers are recorded once per model (plain decoding, real llama.cpp) under
$LOCALSPEC_HOME/replay-<model>-....json. Greedy decoding is deterministic, so the replayed
acceptance equals a real run's; only the clock is simulated. With a temperature the answers
are sampled (one per seed) and the controller is told the request is sampled. The replay is
then exact in law: rejection sampling keeps an n-gram guess x with probability p(x), the same
law as "the target samples a token and the guess is kept if they agree", which is what the
replay does against a recorded sample of p.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localspec.api import load
from localspec.control.accelerators import Accelerator
from localspec.control.calibrate import Calibration, calibrated, prior_from
from localspec.control.config import DEFAULT
from localspec.control.costs import CostCurve
from localspec.control.factory import ngram_policy
from localspec.control.hardware import DeviceProbe, cpu_probe
from localspec.control.policy import AdaptiveDraftLength, FixedDraftLength
from localspec.control.prompts import BenchPrompt, load_prompt_sets
from localspec.control.replay import LookupCache, Truth, calibration_from_doctor, ceiling, replay, replay_lookup
from localspec.core.backend_loader import load_backend
from localspec.core.drafting import DraftLengthPolicy
from localspec.core.sampling import SamplingConfig
from localspec.drafters.ngram import NgramDrafter
from localspec.store import data_dir


def record(
    model: str, tokens: int, path: Path, prompts: Sequence[BenchPrompt], temperature: float, seeds: int
) -> dict[str, object]:
    runtime = load(model=model, strategy="none")
    answers = {}
    for prompt in prompts:
        ids = runtime.prompt_tokens(messages=prompt.messages)
        for seed in range(seeds) if temperature > 0 else [None]:
            out = runtime.generate(messages=prompt.messages, max_tokens=tokens, temperature=temperature, seed=seed)
            key = prompt.id if seed is None else f"{prompt.id}#{seed}"
            answers[key] = {"prompt": ids, "answer": list(out.tokens)}
    data = {
        "calibration": calibrated(runtime.target).to_json(),
        "n_vocab": runtime.target.info.n_vocab,
        "answers": answers,
    }
    path.write_text(json.dumps(data))
    runtime.close()
    return data


def from_doctor(path: Path) -> Calibration:
    """The calibration a `localspec doctor --json` printed, on whatever machine it ran: the
    recorded answers can then be priced on that machine's curve."""
    return calibration_from_doctor(json.loads(path.read_text()))


def prior_for(model: str, doctor: Path | None) -> Calibration:
    """The prior a first run of `model` starts from, on this machine or the doctor report's."""
    backend = load_backend("llamacpp", model)
    size, params = backend.info.size_bytes, backend.info.n_params
    backend.close()
    device = cpu_probe()
    if doctor is not None:
        found = json.loads(doctor.read_text())["device"]
        found["simd"] = tuple(found["simd"])
        found["accelerators"] = tuple(Accelerator(**a) for a in found["accelerators"])
        device = DeviceProbe(**found)
    return prior_from(device, size, params)


def adaptive(curve: CostCurve) -> AdaptiveDraftLength:
    """The controller as the runtime builds it for n-gram drafting."""
    return ngram_policy(curve)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--trace", action="store_true", help="print support:drafted/accepted per step")
    parser.add_argument("--fixed", type=int, action="append", default=[], help="also replay a fixed draft length")
    parser.add_argument(
        "--prompts", action="append", help="'suite' or a JSONL file as `localspec bench --prompts` takes; repeatable"
    )
    parser.add_argument("-t", "--temperature", type=float, default=0.0, help="replay sampled answers")
    parser.add_argument("--seeds", type=int, default=3, help="sampled answers per prompt (with -t)")
    parser.add_argument(
        "--curve", type=Path, help="price the passes on this `localspec doctor --json` report (another machine's)"
    )
    parser.add_argument("--prior", action="store_true", help="add a first run from the prior, without calibration")
    args = parser.parse_args()
    sources = args.prompts or ["suite"]
    suite = "+".join(Path(source).stem for source in sources)
    sampled = args.temperature > 0
    kind = f"-t{args.temperature:g}x{args.seeds}" if sampled else ""
    path = data_dir() / f"replay-{Path(args.model).name}-{suite}-{args.tokens}{kind}.json"
    if path.exists():
        data = json.loads(path.read_text())
    else:
        prompts = load_prompt_sets(sources)
        data = record(args.model, args.tokens, path, prompts, args.temperature, args.seeds)
    loaded = from_doctor(args.curve) if args.curve else Calibration.from_json(data["calibration"])
    if loaded is None:
        raise SystemExit(f"{path} was recorded by an older localspec: delete it to record the answers again")
    calibration = loaded
    cal = calibration.to_json()
    print(
        f"graph rebuild (ms): into a block {calibration.rebuild_block_seconds * 1e3:.2f}, "
        f"into one token {calibration.rebuild_one_seconds * 1e3:.2f}"
    )
    for name, values in (("curve", cal["verify_seconds"]), ("deep curve", cal["deep_verify_seconds"] or [])):
        print(f"{name} (ms): {' '.join(f'{t * 1e3:.1f}' for t in values)}")
    # On sampled answers, also the controller as if the requests were greedy (its greedy
    # priors and tables): what the separate sampled tables change.
    prior = prior_for(args.model, args.curve) if args.prior else None
    columns = ["localspec", *(["greedy priors"] if sampled else []), "no depth", *(["from prior"] if prior else [])]
    columns += [*(f"fixed {g}" for g in args.fixed), "lookup 4", "lookup 8", "ceiling", f"ceiling ≤{DEFAULT.max_draft}"]
    columns += ["lookup ceiling"]
    print(
        "speedup over plain decoding, simulated clock; ceiling: the best any draft length could do "
        f"(drafts of up to 64 tokens, or up to the runtime's {DEFAULT.max_draft})"
    )
    print(f"| prompt | {' | '.join(columns)} |")
    print(f"|---|{'---|' * len(columns)}")
    totals = [0.0] * (len(columns) + 1)
    losses = [0] * len(columns)
    for pid, rec in data["answers"].items():
        prompt, answer = rec["prompt"], rec["answer"]
        truth = Truth.of(calibration)
        plain = truth.plain(prompt, answer)

        policies: list[tuple[DraftLengthPolicy, bool]] = [
            (adaptive(calibration.cost_curve()), sampled),
            *([(adaptive(calibration.cost_curve()), False)] if sampled else []),
            (adaptive(CostCurve(list(cal["verify_seconds"]))), sampled),
            *([(adaptive(prior.cost_curve()), sampled)] if prior else []),
            *((FixedDraftLength(g), sampled) for g in args.fixed),
        ]
        seconds = [
            replay(prompt, answer, truth, data["n_vocab"], policy, args.trace, kind, real_time=True)
            for policy, kind in policies
        ]
        seconds += [replay_lookup(prompt, answer, truth, n) for n in (4, 8)]
        ours, theirs = NgramDrafter(), []
        ours.start(prompt)
        text = prompt + answer
        cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
        guesses = [ours.propose(text[: len(prompt) + i], 64, cfg, rng).tokens for i in range(len(answer))]
        theirs = [LookupCache(text[: len(prompt) + i]).draft(64) for i in range(len(answer))]
        # The runtime drafts at most max_draft tokens (its calibration stops at 16-token
        # passes); the uncapped ceiling prices longer passes on the curve's extension.
        capped = [guess[: DEFAULT.max_draft] for guess in guesses]
        seconds += [ceiling(prompt, answer, truth, g) for g in (guesses, capped, theirs)]
        print(f"| {pid} | {' | '.join(f'{plain / t:.2f}x' for t in seconds)} |")
        totals = [a + b for a, b in zip(totals, [plain, *seconds], strict=True)]
        losses = [n + (plain / t < 0.98) for n, t in zip(losses, seconds, strict=True)]
    print(f"| all (total time) | {' | '.join(f'{totals[0] / t:.2f}x' for t in totals[1:])} |")
    print(f"| answers below 0.98x | {' | '.join(str(n) for n in losses)} |")


if __name__ == "__main__":
    main()
