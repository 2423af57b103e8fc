"""Sizes llama.cpp cannot take are served or refused before it sees them: a context of 1 to 64
tokens is served as llama.cpp's smallest (256 cells), a batch too small for the tree's
sequences is refused with the fix, and neither ever aborts the process (GGML_ASSERT), which
an app embedding localspec could not catch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localspec.backends.llamacpp.build import MIN_CONTEXT, context_cells
from localspec.core.errors import InvalidRequestError

pytestmark = pytest.mark.model

# One child process for the whole sweep: an abort kills it, and the lines it printed before
# say which size did. Every size from 1 to 64 asks llama.cpp for the same 256 cells
# (context_cells, checked for each below), so the loads take the sizes around the tree's
# sequences and the powers of two, where llama.cpp's own padding and batch caps switch.
LOADED = (1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64)
CONTEXT_SWEEP = f"""
import sys
import localspec
for n_ctx in {LOADED}:
    with localspec.load(sys.argv[1], n_ctx=n_ctx, strategy="none", calibrate=False, threads=1) as rt:
        out = rt.generate("Hello", max_tokens=2, temperature=0)
        print(n_ctx, rt.target.info.n_ctx, out.finish_reason, flush=True)
"""


def test_a_context_of_1_to_64_tokens_is_served_as_256_cells_and_never_aborts(smollm2_q4_1: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CONTEXT_SWEEP, str(smollm2_q4_1)], capture_output=True, text=True, timeout=600
    )
    served = [line.split() for line in child.stdout.splitlines()]
    assert child.returncode == 0, f"died after n_ctx={served[-1][0] if served else 'none'}: {child.stderr[-400:]}"
    assert [int(row[0]) for row in served] == list(LOADED)
    assert {(row[1], row[2]) for row in served} == {("256", "max_tokens")}
    assert {context_cells(n, 8192) for n in range(1, 65)} == {MIN_CONTEXT}


@pytest.mark.parametrize("max_block", [0, 1, 15, -3, 2.5, True])
def test_a_batch_smaller_than_the_trees_sequences_is_refused_with_the_default_named(
    smollm2_q4_1: Path, max_block: object
) -> None:
    from localspec.backends.llamacpp.backend import LlamaCppBackend

    with pytest.raises(InvalidRequestError, match=r"max_block .* 16 or more") as refused:
        LlamaCppBackend(str(smollm2_q4_1), n_ctx=256, threads=1, max_block=max_block)  # type: ignore[arg-type]
    assert "leave max_block out" in (refused.value.hint or "")


def test_the_smallest_batch_taken_runs_a_block(smollm2_q4_1: Path) -> None:
    from localspec.backends.llamacpp.backend import LlamaCppBackend

    backend = LlamaCppBackend(str(smollm2_q4_1), n_ctx=256, threads=1, max_block=16)
    try:
        assert backend.capabilities.max_block == 16
        tokens = backend.tokenize("Hello there", add_special=True, parse_special=False)
        assert backend.eval_block(tokens, "last").shape[0] == 1
    finally:
        backend.close()
