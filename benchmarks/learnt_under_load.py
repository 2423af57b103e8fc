"""What a runtime's learnt cost curve stores after a while of load: n-gram requests on a quiet
machine, then the same with busy processes beside them, then quiet again, in one runtime that
starts from the prior (a fresh user directory, so no curve of earlier sessions). Prints the
curve it stored for later loads and the curve the next load starts from (calibrate.redrawn),
each as passes over k tokens in single steps, beside the curve `localspec doctor` measures
on the quiet machine afterwards. A block priced far dearer in steps than measured is drafted
less than it pays, by every later load.

    python benchmarks/learnt_under_load.py [MODEL.gguf] [--threads 2] [--busy 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPTS = Path(__file__).with_name("prompts_heldout.jsonl")
IDS = ("sql_rename", "sql_table", "csv_rows", "html_table", "json_rename", "poem_sea")
SIZES = (2, 3, 4, 6, 8, 16)


def in_steps(curve: list[float]) -> list[float]:
    return [round(curve[k - 1] / curve[0], 2) for k in SIZES]


def phases(model: str, threads: int, busy: int) -> None:
    import localspec

    prompts = {row["id"]: row["prompt"] for row in map(json.loads, PROMPTS.read_text().splitlines())}
    sampling = localspec.SamplingConfig(temperature=0)
    with localspec.load(model, threads=threads, strategy="ngram") as rt:
        for phase in ("quiet", "busy", "quiet"):
            hogs = [
                subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(busy if phase == "busy" else 0)
            ]
            try:
                rates = []
                for pid in IDS:
                    out = rt.generate(
                        messages=[{"role": "user", "content": prompts[pid]}], max_tokens=160, sampling=sampling
                    )
                    rates.append(round(out.stats.decode_tokens_per_s))
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
            print(f"{phase:>6}: n-gram tok/s {rates}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=None, help="a GGUF (default: the embedded SmolLM2-135M Q4_1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--busy", type=int, default=1, help="busy processes beside the middle requests")
    args = parser.parse_args()
    os.environ["LOCALSPEC_HOME"] = tempfile.mkdtemp(prefix="learnt-under-load-")

    from localspec.control.calibrate import measure
    from localspec.control.costs import redrawn
    from localspec.control.hardware import host_kind
    from localspec.core.backend_loader import load_backend
    from localspec.models.default_model import ensure_pypi_model
    from localspec.store import CALIBRATION

    model = args.model or str(ensure_pypi_model())
    print(f"# {Path(model).name}, {host_kind()} host, {args.threads} threads, {args.busy} busy process(es)")
    phases(model, args.threads, args.busy)
    stored = next((v for k, v in CALIBRATION.load().items() if k.startswith("learnt|")), None)
    if stored is None:
        sys.exit("the runtime stored no learnt curve (too few passes): give it more prompts or longer answers")
    curve, evidence = stored["verify_seconds"], stored["evidence"]
    start = redrawn(curve, [e >= 8 for e in evidence])
    backend = load_backend("llamacpp", model, n_ctx=4096, threads=args.threads)
    quiet = measure(backend).verify_seconds
    print(f"\n| passes over k tokens, in single steps | {' | '.join(f'k={k}' for k in SIZES)} |")
    print(f"|---|{'---|' * len(SIZES)}")
    for name, row in (("stored", curve), ("the next load starts from", start), ("measured quiet", quiet)):
        print(f"| {name} | {' | '.join(f'{r:.2f}' for r in in_steps(row))} |")
    print(f"\npasses behind each stored size: {[int(e) for e in evidence]}")


if __name__ == "__main__":
    main()
