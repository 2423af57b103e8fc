"""The two aborts Mesa 22.3.6's lavapipe gave localspec (issue #60), each in a child process so
a crash ends only that one, on whichever Vulkan driver the loader picks (VK_DRIVER_FILES picks
one: an unpacked mesa-vulkan-drivers 22.3.6 .deb beside the installed Mesa 25, say).

    GGML_VK_VISIBLE_DEVICES=0 [VK_DRIVER_FILES=lvp_icd.json] python benchmarks/vulkan_driver_crashes.py MODEL.gguf

Scenarios: flash attention on, a 3-token pass after a 1-token pass; flash attention off with
the graph's argmax on; the same with it off (the host's argmax), which separates the argmax
from the rest of the pass; both again on a one-token block after a prompt pass without
outputs (what tests/backends/llamacpp/test_llamacpp_device_greedy.py does first); and plain llama.cpp
(llama-cpp-python's own Llama, no localspec code) doing the first scenario. Prints each one's
exit status (-11 is SIGSEGV, -6 SIGABRT).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

PASSES = """
from localspec.backends.llamacpp.backend import LlamaCppBackend
target = LlamaCppBackend({path!r}, n_ctx=256, gpu_layers=99)
target._greedy.wanted = {argmax}
ids = target.tokenize("The three largest cities of France are", add_special=True, parse_special=False)
target.eval_block(ids[:1], "all")
target.eval_block(ids[1:4], "all")
from localspec.api import runtime_for
runtime = runtime_for(target, strategy="ngram", draft_tokens=4)
print(runtime.generate("Count: 1 2 3 4 5", max_tokens=16, temperature=0).text)
"""

# tests/backends/llamacpp/test_llamacpp_device_greedy.py's first steps: a prompt pass without outputs, then the
# graph's argmax on a one-token block.
AFTER_PROMPT = """
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.core.sampling import SamplingConfig
target = LlamaCppBackend({path!r}, n_ctx=256, gpu_layers=99)
target._greedy.wanted = {argmax}
ids = target.tokenize("The three largest cities of France are", add_special=True, parse_special=False)
target.eval_block(ids[:-1], "none")
print(target.verify_block(ids[-1:], None, SamplingConfig(temperature=0.0), None))
"""

RAW = """
import llama_cpp
llm = llama_cpp.Llama({path!r}, n_ctx=256, n_gpu_layers=99, flash_attn=True, verbose=False)
ids = llm.tokenize(b"The three largest cities of France are")
llm.eval(ids[:1])
llm.eval(ids[1:4])
print("two passes done")
"""

SCENARIOS = (
    ("flash attention on, 1-token pass then 3-token pass", "on", PASSES, True),
    ("flash attention off, the graph's argmax", "off", PASSES, True),
    ("flash attention off, the host's argmax", "off", PASSES, False),
    ("flash attention off, the graph's argmax after a prompt pass", "off", AFTER_PROMPT, True),
    ("flash attention off, the host's argmax after a prompt pass", "off", AFTER_PROMPT, False),
    ("llama-cpp-python alone, flash attention on", "on", RAW, False),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    args = parser.parse_args()
    print(f"driver: {os.environ.get('VK_DRIVER_FILES', 'the installed one')}")
    for label, flash, code, argmax in SCENARIOS:
        env = {**os.environ, "LLAMA_ARG_FLASH_ATTN": flash, "PYTHONFAULTHANDLER": "1"}
        child = subprocess.run(
            [sys.executable, "-c", code.format(path=args.model, argmax=argmax)],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        last = (child.stderr.strip().splitlines() or [""])[-1][:160]
        print(f"| {label} | exit {child.returncode} | {last if child.returncode else 'ok'} |", flush=True)


if __name__ == "__main__":
    main()
