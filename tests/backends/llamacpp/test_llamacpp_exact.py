"""`exact`: llama.cpp's CPU kernels chosen so a verify block gets the logits of one-token passes.

By default a K-quant target loads unrepacked and verifies blocks of 8+ tokens in pieces of 7
(backends/llamacpp/kernels.py), so greedy speculation at a fixed draft length is plain
decoding's while the context stays within 256 tokens (flash attention splits a one-token
pass past that); `--exact` makes it so at any length.

With llama.cpp's default kernels a block and a one-token pass sum in different orders (ggml's
tiled K-quant matmul for 8+ rows, repacked K-quants for 4+, llamafile's tinyBLAS for attention
products of 2+ rows, flash attention's split over the cache for one row past 512 cells), so
greedy speculative output on a Q4_K_M model drifts from plain decoding within a few hundred
tokens (BENCHMARKS.md, "Bit for bit"). The exact kernels need a build without llamafile: on
the usual build `exact` is refused with the command that makes one; on such a build a fresh
process (ggml reads its kernel switch once) decodes the same text both ways.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localspec.api import Completion, load
from localspec.backends.llamacpp.backend import batch_invariant_build
from localspec.cli.main import main
from localspec.core.errors import BackendUnavailableError, InvalidRequestError
from localspec.core.options import LoadOptions

pytestmark = pytest.mark.model

# Plain decoding and speculation in one fresh process, greedy, long enough to pass 512 cells.
_SCRIPT = """
import json, sys
from localspec.api import Completion, load
model, prompts = sys.argv[1], json.loads(sys.argv[2])
texts = {}
for strategy in ("none", "ngram"):
    with load(model, strategy=strategy, exact=True, calibrate=False, memory=False, n_ctx=2048) as rt:
        texts[strategy] = [
            rt.generate(messages=[{"role": "user", "content": p}], max_tokens=480, temperature=0).text for p in prompts
        ]
print(json.dumps(texts))
"""
PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List ten facts about the planet Mars, one per line, with a short explanation for each.",
]


# Two wide-set prompts whose greedy answers on the SmolLM2 Q4_K_M part from plain decoding at
# γ = 4 and 8 with llama.cpp's own kernels (repacked Q4_K, whole blocks; BENCHMARKS.md §2c).
# They part at tokens 6 and 10-12.
PARTING_PROMPTS = [
    "Give me a simple recipe for pancakes with a list of ingredients and numbered steps.",
    "Write a bash script that counts the lines of every .py file in the current folder and prints the total.",
]
SHORT = 48  # tokens: past both partings, and within the 256 cells flash attention keeps whole


CHATS = [[{"role": "user", "content": p}] for p in PARTING_PROMPTS]


@pytest.fixture(scope="module")
def plain_q4_k_m(derived_models: Any) -> list[Completion]:
    """Plain decoding of the parting prompts on the Q4_K_M target, once for every draft length."""
    with load(str(derived_models["Q4_K_M"]), strategy="none", calibrate=False, memory=False, n_ctx=512) as rt:
        return [rt.generate(messages=m, max_tokens=SHORT, temperature=0) for m in CHATS]


@pytest.mark.parametrize("gamma", [4, 8])
def test_default_speculation_on_q4_k_m_is_plain_decoding_bit_for_bit(
    gamma: int, derived_models: Any, plain_q4_k_m: list[Completion]
) -> None:
    target, drafter = str(derived_models["Q4_K_M"]), str(derived_models["Q4_0"])
    plain, chats = plain_q4_k_m, CHATS
    options: dict[str, Any] = {"draft_model": drafter, "strategy": "draft", "draft_tokens": gamma, "calibrate": False}
    with load(target, memory=False, n_ctx=512, **options) as rt:
        spec = [rt.generate(messages=m, max_tokens=SHORT, temperature=0) for m in chats]
    assert [s.tokens for s in spec] == [p.tokens for p in plain]
    assert all(s.stats.accepted and max(s.stats.gamma_histogram) == gamma for s in spec)
    assert all(s.stats.prompt_tokens + s.stats.generated_tokens <= 256 for s in spec)
    assert all(s.stats.bit_exact for s in spec), [s.stats.inexact_reason for s in spec]


def test_exact_is_for_llama_cpp_on_this_machines_cpu() -> None:
    for given in ({"backend": "torch"}, {"rpc": "127.0.0.1:50052"}, {"gpu_layers": 4}):
        with pytest.raises(InvalidRequestError, match=r"exact is for the llama\.cpp backend"):
            LoadOptions(exact=True, **given)  # type: ignore[arg-type]
    assert LoadOptions(exact=True).backend_options()["exact"] is True
    assert "exact" not in LoadOptions().backend_options()


@pytest.mark.skipif(batch_invariant_build(), reason="this llama.cpp is built without llamafile")
def test_exact_on_a_llamafile_build_says_how_to_get_one(smollm2_q4_1: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BackendUnavailableError) as refused:
        load(str(smollm2_q4_1), exact=True, calibrate=False)
    assert "-DGGML_LLAMAFILE=OFF" in str(refused.value.hint)
    assert main(["run", "--model", str(smollm2_q4_1), "--exact", "--max-tokens", "4", "Hi"]) == 2
    err = capsys.readouterr().err
    assert "without llamafile" in err and "GGML_LLAMAFILE=OFF" in err and "Traceback" not in err


@pytest.mark.skipif(not batch_invariant_build(), reason="needs a llama.cpp built with -DGGML_LLAMAFILE=OFF")
@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q4_1"])
def test_exact_speculation_is_plain_decoding_bit_for_bit(ftype: str, smollm2_q4_1: Path, tmp_path: Path) -> None:
    from localspec.backends.llamacpp.copies import derived

    model = smollm2_q4_1 if ftype == "Q4_1" else derived(smollm2_q4_1, ftype, tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(model), json.dumps(PROMPTS)], capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-2000:]
    texts = json.loads(run.stdout.strip().splitlines()[-1])
    assert texts["ngram"] == texts["none"]
    # Past a 512-cell cache view, where flash attention would split a one-token pass.
    assert all(len(t) > 600 for t in texts["none"])


@pytest.mark.skipif(not batch_invariant_build(), reason="needs a llama.cpp built with -DGGML_LLAMAFILE=OFF")
def test_exact_after_a_model_has_run_in_this_process_is_refused(target_backend: object, smollm2_q4_1: Path) -> None:
    import os

    if os.environ.get("GGML_CPU_TILED_MM") == "0":
        pytest.skip("this process started with the exact kernel switch")
    with pytest.raises(InvalidRequestError, match="before the first model of this process runs"):
        load(str(smollm2_q4_1), exact=True, calibrate=False)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_quantized_hybrids_blocks_give_one_token_passes_logits_up_to_its_plans_prompt_rows(
    tmp_path: Path, threads: int
) -> None:
    # A quantized Qwen3.5-style file keeps its convolution kernels F32. They feed ggml_ssm_conv,
    # not a matmul, so the plan does not count them as float weights (tinyBLAS's 2+ row order):
    # its blocks up to prompt_rows (63) must then give the one-token passes' rows, bit for bit,
    # on the host's kernels, which is what lets a hybrid's lanes share passes.
    import numpy as np

    from localspec.backends.llamacpp.copies import quantize
    from localspec.core.backend_loader import load_backend
    from localspec.testing.gguf_writer import HybridSpec, write_qwen35_gguf

    source = write_qwen35_gguf(HybridSpec(), tmp_path / "hybrid-f32.gguf")
    backend = load_backend(
        "llamacpp", str(quantize(source, tmp_path / "hybrid.gguf", "Q8_0")), n_ctx=256, threads=threads
    )
    try:
        limit = backend.capabilities.exactness.prompt_rows
        assert limit == 63, backend.capabilities.exactness
        tokens = [int(t) for t in np.random.default_rng(3).integers(5, 200, size=limit)]
        one = np.stack([np.array(backend.eval_block([t], "all")[0]) for t in tokens])
        for block in (2, 5, 8, 40, limit):
            backend.rollback(0)
            # Copied as they come: a pass's rows are a view the next pass overwrites.
            pieces = [np.array(backend.eval_block(tokens[at : at + block], "all")) for at in range(0, limit, block)]
            assert np.array_equal(np.concatenate(pieces), one), block
    finally:
        backend.close()
