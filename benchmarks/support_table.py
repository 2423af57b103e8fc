"""Which strategy runs on which architecture and backend: every cell tried for real on tiny
random-weight GGUFs (localspec/testing/gguf_writer.py), greedy, against plain decoding on the same
backend. A cell reads `yes` (ran, same tokens as plain decoding), `refused: ...` (the
message localspec gave, shortened), `–` (the model does not load there: see `none`), or
`DIFFERS` (a bug). Prints the markdown table that benchmarks/pages/support.md shows; the tests of each
refusal and of each strategy's exactness are where the cells are kept true.

    python benchmarks/support_table.py > table.md   (about 2 minutes)

The MLX column reads the same GGUF files; Qwen3.6's MTP head and Gemma 4's assistant run
on MLX from MLX folders (mlx-community's *-MTP-* and *-assistant-* repos), which this
table does not build: see benchmarks/pages/mlx.md.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import localspec
from localspec.core.errors import LocalspecError
from localspec.testing.gguf_writer import Gemma4Spec, HybridSpec, Spec, write_gemma4_pair, write_gguf, write_qwen35_gguf

BACKENDS = ("llamacpp", "torch", "mlx")
STRATEGIES = ("ngram", "draft", "qspec", "layerskip:2", "mtp")
# qspec's low-bit type as each backend spells it (a fixed one: the measured best derives several).
QSPEC = {"llamacpp": "qspec:Q4_0", "torch": "qspec:int8", "mlx": "qspec:4"}
PROMPT = "the world and the world and the"


def models(folder: Path) -> dict[str, tuple[Path, Path | None]]:
    """architecture -> (target, its MTP assistant file or None)."""
    target, assistant = write_gemma4_pair(Gemma4Spec(echo=True, seed=1), folder)
    return {
        "llama": (write_gguf(Spec("llama"), folder / "llama.gguf"), None),
        "gemma3": (write_gguf(Spec("gemma3"), folder / "gemma3.gguf"), None),
        "qwen35 + MTP head": (write_qwen35_gguf(HybridSpec(nextn=1), folder / "qwen35.gguf"), None),
        "gemma4 + assistant": (target, assistant),
    }


def cell(target: Path, assistant: Path | None, backend: str, strategy: str, plain: list[int] | str) -> str:
    if isinstance(plain, str):
        return "–"  # the model does not load on this backend at all (the `none` column says why)
    strategy = QSPEC[backend] if strategy == "qspec" else strategy
    draft = str(assistant if strategy == "mtp" and assistant else target) if strategy in ("draft", "mtp") else None
    if strategy == "mtp" and assistant is None:
        draft = None
    try:
        opts = {"backend": backend, "n_ctx": 128, "draft_tokens": 2, "draft_model": draft}
        with localspec.load(model=str(target), strategy=strategy, **opts) as runtime:  # type: ignore[arg-type]
            tokens = runtime.generate(prompt=PROMPT, max_tokens=12, temperature=0).tokens
    except LocalspecError as exc:
        return "refused: " + short(exc.message)
    return "yes" if tokens == plain else "DIFFERS"


def plain_tokens(target: Path, backend: str) -> list[int] | str:
    try:
        with localspec.load(model=str(target), backend=backend, strategy="none", n_ctx=128) as runtime:
            return runtime.generate(prompt=PROMPT, max_tokens=12, temperature=0).tokens
    except LocalspecError as exc:
        return "refused: " + short(exc.message)


def short(message: str) -> str:
    text = " ".join(word for word in message.split() if "/" not in word or not word.startswith("/"))
    text = text.replace("|", "/").rstrip(";:,")
    return text if len(text) <= 64 else text[:61] + "..."


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for arch, (target, assistant) in models(Path(tmp)).items():
            for backend in BACKENDS:
                plain = plain_tokens(target, backend)
                cells = [cell(target, assistant, backend, s, plain) for s in STRATEGIES]
                rows.append((arch, backend, plain if isinstance(plain, str) else "yes", *cells))
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print("| architecture | backend | none | " + " | ".join(STRATEGIES) + " |")
    print("|" + "---|" * (3 + len(STRATEGIES)))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
