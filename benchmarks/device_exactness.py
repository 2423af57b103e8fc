"""Whether a verify block on a llama.cpp GPU device gives the logits of one-token passes:
for each block size k, the k rows of one k-token pass against k one-token passes over the
same tokens and cache, bit for bit. This is what `bit_exact` would need checked on a device
(the CPU's kernels are planned in backends/llamacpp/kernels.py; a device's are not).

    GGML_VK_VISIBLE_DEVICES=0 python benchmarks/device_exactness.py SMOLLM2.gguf [--max-k 17]

Prints, per k, whether every row is identical and the largest difference.
"""

from __future__ import annotations

import argparse

import numpy as np

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.backends.llamacpp.gpu import gpu_device

PROMPT = "The three largest cities of France are Paris, Marseille and Lyon. The three largest cities of Italy are"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--max-k", type=int, default=17)
    parser.add_argument("--gpu-layers", type=int, default=99)
    args = parser.parse_args()
    target = LlamaCppBackend(args.model, n_ctx=512, gpu_layers=args.gpu_layers)
    print(f"device: {gpu_device()}; {target.capabilities.extra.get('gpu', 'the CPU')}")
    prompt = target.tokenize(PROMPT, add_special=True, parse_special=False)
    head, tail = prompt[: len(prompt) // 2], prompt[len(prompt) // 2 :]
    text = (tail * 4)[: args.max_k]  # tokens to verify, as a draft would give them
    print("| k | rows identical to one-token passes | largest difference |\n|---|---|---|")
    for k in range(1, args.max_k + 1):
        target.rollback(0)
        target.eval_block(head, "none")
        block = np.array(target.eval_block(text[:k], "all"), dtype=np.float32)
        target.rollback(len(head))
        singles = np.array([target.eval_block([t], "all")[-1].copy() for t in text[:k]], dtype=np.float32)
        same = sum(bool(np.array_equal(a, b)) for a, b in zip(block, singles, strict=True))
        print(f"| {k} | {same}/{k} | {float(np.max(np.abs(block - singles))):.2e} |", flush=True)
    target.close()


if __name__ == "__main__":
    main()
