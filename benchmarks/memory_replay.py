"""Requests like earlier ones, replayed on a simulated clock: the sessions of
`prompts_sessions.jsonl` answered once by plain greedy decoding (recorded), then replayed
through the real engine, n-gram drafter and adaptive policy on a measured cost curve, with and
without the runtime's memory of the session's earlier requests, beside llama-lookup's own
drafter (its n-gram counts and thresholds, `localspec.control.replay.LookupCache`) with and
without its dynamic cache (`-lcd`). No model runs in a replay, so the host's load moves no
figure: what it measures is the drafting rule, not the machine (memory_bench.py times both).

    python benchmarks/memory_replay.py record MODEL.gguf -o ANSWERS.json [-n 160] [--threads 1]
    python benchmarks/memory_replay.py replay ANSWERS.json [--curve smollm2-135m-q4_1]
        [--start CALIBRATION.json [--start-match Q4_1.gguf]] [--doctor DOCTOR.json]

--start: the policies start from the learnt curve a calibration cache holds (a host's
$LOCALSPEC_HOME/calibration.json, the first learnt entry whose key contains --start-match), as
a runtime on that host does, while the passes cost what --curve says; --doctor: the curve of a
`localspec doctor --refresh --json` report instead (today's host).

Figures are over every request but each session's first, which nothing can be recalled for;
one policy per session and column, as one runtime serves a session.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memory_bench import SESSIONS, load_sessions

from localspec.control.replay import calibration_from_doctor, learnt_calibration, replay_session
from localspec.tooling.bench import geometric_mean

ROOT = Path(__file__).resolve().parent.parent
CURVES = ROOT / "tests" / "data" / "replay_curves.json"


def record(model: str, out: Path, max_tokens: int, threads: int) -> None:
    from localspec.api import runtime_for
    from localspec.core.backend_loader import load_backend

    target = load_backend("llamacpp", model, n_ctx=4096, threads=threads)
    runtime = runtime_for(target, strategy="none")
    sessions: dict[str, list[dict[str, list[int]]]] = {}
    for name, prompts in load_sessions(SESSIONS).items():
        sessions[name] = []
        for prompt in prompts:
            messages = [{"role": "user", "content": prompt}]
            tokens = runtime.prompt_tokens(None, messages)
            answer = runtime.generate(messages=messages, max_tokens=max_tokens, temperature=0.0).tokens
            sessions[name].append({"prompt": list(tokens), "answer": list(answer)})
        print(name, len(prompts), "requests", flush=True)
    data = {"model": Path(model).name, "n_vocab": target.info.n_vocab, "sessions": sessions}
    out.write_text(json.dumps(data), encoding="utf-8")
    target.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("model")
    rec.add_argument("-o", "--out", type=Path, required=True)
    rec.add_argument("-n", "--max-tokens", type=int, default=160)
    rec.add_argument("--threads", type=int, default=1)
    rep = sub.add_parser("replay")
    rep.add_argument("answers", type=Path)
    rep.add_argument("--curve", default="smollm2-135m-q4_1", help="a curve of tests/data/replay_curves.json")
    rep.add_argument("--doctor", type=Path, help="a `localspec doctor --json` report: its curve is the truth")
    rep.add_argument("--start", type=Path, help="a calibration cache whose learnt curve the policies start from")
    rep.add_argument("--start-match", default="", help="a part of the learnt entry's key (the model file)")
    args = parser.parse_args()
    if args.command == "record":
        record(args.model, args.out, args.max_tokens, args.threads)
        return
    data = json.loads(args.answers.read_text(encoding="utf-8"))
    if args.doctor:
        args.curve = str(args.doctor)
        cal = calibration_from_doctor(json.loads(args.doctor.read_text(encoding="utf-8")))
    else:
        cal = calibration_from_doctor(json.loads(CURVES.read_text(encoding="utf-8"))[args.curve])
    start = learnt_calibration(args.start, args.start_match) if args.start else None
    rows = {name: replay_session(reqs, cal, data["n_vocab"], start=start) for name, reqs in data["sessions"].items()}
    columns = list(next(iter(rows.values())))
    begin = f", starting from the learnt curve in {args.start}" if args.start else ""
    print(f"{data['model']} on the {args.curve} curve{begin}: speedup over plain decoding (simulated)")
    print("| session | " + " | ".join(columns[1:]) + " | memory / n-gram | memory / γ=4 -lcd | memory / γ=8 -lcd |")
    print("|---" * (len(columns) + 3) + "|")
    ratios: dict[str, list[float]] = {}
    for name, s in [*rows.items()]:
        cells = {c: s["plain"] / s[c] for c in columns[1:]}
        mem = cells["ngram+memory"]
        extra = {"mem/ngram": mem / cells["ngram"], **{f"mem/{g}": mem / cells[f"lookup γ={g} -lcd"] for g in (4, 8)}}
        for key, value in {**cells, **extra}.items():
            ratios.setdefault(key, []).append(value)
        print(f"| {name} | " + " | ".join(f"{v:.3f}x" for v in [*cells.values(), *extra.values()]) + " |")
    print("| **geometric mean** | " + " | ".join(f"{geometric_mean(v):.3f}x" for v in ratios.values()) + " |")


if __name__ == "__main__":
    main()
