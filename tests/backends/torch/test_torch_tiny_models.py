"""The torch backend on tiny random models written by the test itself, one per family.

Each family's model is written twice (localspec/testing/gguf_writer.py): as a GGUF and as a Hugging Face
folder. llama.cpp, reading the same GGUF, is the reference for the architecture and the
SentencePiece tokenizer; the engine's own chi-square test checks that speculative sampling
through this backend is exact.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch backend tests need PyTorch: pip install 'localspec[torch]'")

from test_exactness import chi_square_pvalue, emitted, exact_joint, outcome, run_rng  # noqa: E402

from localspec.api import runtime_for  # noqa: E402
from localspec.backends.torch import TorchBackend, linear, native  # noqa: E402
from localspec.backends.torch.linear import Int4, Int8, Panels  # noqa: E402
from localspec.cli.main import main  # noqa: E402
from localspec.core.backend_loader import load_backend  # noqa: E402
from localspec.core.engine import Engine  # noqa: E402
from localspec.core.errors import BackendUnavailableError, InvalidRequestError  # noqa: E402
from localspec.core.protocol import Backend  # noqa: E402
from localspec.core.sampling import SamplingConfig, one_hot, process  # noqa: E402
from localspec.core.stats import Stats  # noqa: E402
from localspec.drafters.model import ModelDrafter  # noqa: E402
from localspec.drafters.ngram import NgramDrafter  # noqa: E402
from localspec.testing.gguf_writer import CHATML, N_CTX, Spec, write_hf_folder  # noqa: E402


def tiny(path: str, n_ctx: int = N_CTX, **options: object) -> TorchBackend:
    # One thread: a model this small is all overhead, and a second thread only adds
    # synchronisation (which costs whole scheduler slices on a busy 2-core machine).
    return TorchBackend(path, n_ctx=n_ctx, threads=1, **options)  # type: ignore[arg-type]


def llamacpp(path: Path) -> Iterator[Backend]:
    pytest.importorskip("llama_cpp", reason="the llama.cpp comparisons need llama-cpp-python")
    backend = load_backend("llamacpp", str(path), n_ctx=N_CTX, threads=1)
    yield backend
    backend.close()


FAMILIES = [Spec("llama"), Spec("qwen2"), Spec("gemma3")]
TEXT_IDS = [5 + (i * 37) % 250 for i in range(40)]  # token ids valid in both vocabularies
BLOCKS = [5, 1, 8, 3, 1, 7, 2, 13]  # uneven blocks: single steps, verify-sized and prefill-sized


def blockwise(backend: Backend, tokens: list[int], blocks: list[int] = BLOCKS) -> np.ndarray:
    backend.rollback(0)
    rows, at = [], 0
    for size in blocks:
        rows.append(backend.eval_block(tokens[at : at + size], "all").copy())
        at += size
    return np.concatenate(rows)


# -- the architectures against llama.cpp ------------------------------------------------------


@pytest.mark.parametrize("spec", FAMILIES, ids=lambda s: s.arch)
def test_logits_match_llamacpp_on_the_same_gguf(models, spec: Spec) -> None:
    path = models(spec)
    ours = blockwise(tiny(str(path)), TEXT_IDS)
    for reference in llamacpp(path):
        theirs = blockwise(reference, TEXT_IDS)
        # llama.cpp keeps its KV cache in float16: agreement to about 1e-3 of the logit scale.
        assert np.abs(ours - theirs).max() < 0.01 * np.abs(theirs).max()
        assert (ours.argmax(1) == theirs.argmax(1)).all()


def test_gemma3_sliding_window_changes_what_local_layers_see(models) -> None:
    # Control for the test above: the window must matter on these texts, or it tests nothing.
    spec = Spec("gemma3")
    windowed = blockwise(tiny(str(models(spec))), TEXT_IDS)
    unwindowed = blockwise(tiny(str(models(replace(spec, window=10_000)))), TEXT_IDS)
    np.testing.assert_allclose(windowed[: spec.window], unwindowed[: spec.window], rtol=1e-5, atol=1e-5)
    assert np.abs(windowed[8:] - unwindowed[8:]).max() > 0.1


TEXTS = ["the world and the sand", "hello ☃ world! 12345", "  leading spaces\nand\ttabs\n\n", "<start_of_turn>user"]
TEXTS += ["<|im_start|>user\nI'm here, they'll see<|im_end|>"]


@pytest.mark.parametrize("parse_special", [False, True])
@pytest.mark.parametrize("spec", FAMILIES, ids=["bpe-smollm", "bpe-qwen2", "sentencepiece"])
def test_the_tokenizer_built_from_gguf_matches_llamacpp(models, spec: Spec, parse_special: bool) -> None:
    path = models(spec)
    ours = tiny(str(path))
    for reference in llamacpp(path):
        for text in TEXTS:
            ids = ours.tokenize(text, add_special=True, parse_special=parse_special)
            assert ids == reference.tokenize(text, add_special=True, parse_special=parse_special), text
            assert ours.detokenize(ids) == reference.detokenize(ids)
        assert ours.vocab_identity() == reference.vocab_identity()
        assert ours.end_of_generation() == reference.end_of_generation()


# -- loading from a Hugging Face folder -------------------------------------------------------


@pytest.mark.parametrize("spec", FAMILIES, ids=lambda s: s.arch)
def test_a_safetensors_folder_loads_the_same_model_as_its_gguf(models, tmp_path: Path, spec: Spec) -> None:
    gguf_path = models(spec)
    folder = write_hf_folder(spec, tmp_path / spec.arch, gguf_path)
    from_gguf, from_hf = (
        tiny(
            str(gguf_path),
        ),
        tiny(str(folder)),
    )
    np.testing.assert_allclose(blockwise(from_hf, TEXT_IDS), blockwise(from_gguf, TEXT_IDS), rtol=1e-4, atol=1e-4)
    text = "the world and the sand <|im_end|>"
    for special in (False, True):
        assert from_hf.tokenize(text, add_special=True, parse_special=special) == from_gguf.tokenize(
            text, add_special=True, parse_special=special
        )
    assert from_hf.chat_template() == from_gguf.chat_template() == CHATML
    assert from_hf.end_of_generation() == from_gguf.end_of_generation()
    assert from_hf.vocab_identity() == from_gguf.vocab_identity()
    assert from_hf.info.architecture == from_gguf.info.architecture == spec.arch


# -- the cache --------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [Spec("llama"), Spec("gemma3")], ids=lambda s: s.arch)
def test_the_graph_ready_static_path_computes_what_the_eager_path_does(models, spec: Spec) -> None:
    # CUDA graphs replay the static path (whole-cache attention masked from a positions
    # tensor, index_copy_ cache writes); it runs on the CPU too, so it is checked here.
    path = models(spec)
    eager = blockwise(tiny(str(path), 64), TEXT_IDS)
    static = blockwise(tiny(str(path), n_ctx=64, static=True), TEXT_IDS)
    np.testing.assert_allclose(static, eager, rtol=1e-5, atol=1e-5)


# rollback, logits modes and a full context: test_backend_contract.py


# -- speculation through the engine is exact --------------------------------------------------


class ExactLaw:
    """The target's processed next-token distribution, from plain single-context evaluation."""

    def __init__(self, backend: TorchBackend) -> None:
        self.backend = backend

    def exact_probs(self, context: list[int], cfg: SamplingConfig) -> np.ndarray:
        self.backend.rollback(0)
        row = self.backend.eval_block(context, "last")[-1]
        self.backend.rollback(0)
        dist = one_hot(int(np.argmax(row))) if cfg.greedy else process(row, cfg)
        return dist.dense(self.backend.info.n_vocab)

    def end_of_generation(self) -> frozenset[int]:
        return self.backend.end_of_generation()


def sampled_outcomes(engine: Engine, cfg: SamplingConfig) -> Counter[tuple[int, int]]:
    """EXACT_RUNS speculative continuations of EXACT_PROMPT, counted by their first tokens."""
    observed: Counter[tuple[int, int]] = Counter()
    drafted = accepted = 0
    for run in range(EXACT_RUNS):
        stats = Stats()
        observed[outcome(emitted(engine, EXACT_PROMPT, 4, cfg, 3, run_rng(run), stats, enough=2))] += 1
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > accepted > 0  # both acceptance and rejection happened
    return observed


SMALL = Spec("llama", layers=2)
EXACT_RUNS = 1000
EXACT_PROMPT = [40, 41, 42, 43, 40, 41, 42, 43, 40, 41]  # repeats itself: n-gram drafts too


@pytest.mark.parametrize(
    ("drafter", "cfg"),
    [
        ("model", SamplingConfig(temperature=0.9, top_k=8, top_p=1.0, min_p=0.0)),
        ("ngram", SamplingConfig(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0)),
        ("qspec-int4", SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
        ("layerskip", SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
    ],
    ids=["draft-model-top-k", "ngram-top-p", "qspec-int4", "layerskip-shared-cache"],
)
def test_speculative_sampling_follows_the_target_law(models, drafter: str, cfg: SamplingConfig) -> None:
    target = tiny(str(models(SMALL)), n_ctx=64)
    drafters = {
        "model": lambda: ModelDrafter(tiny(str(models(replace(SMALL, noise=0.5))), n_ctx=64)),
        "ngram": lambda: NgramDrafter(min_ngram=1),
        # int4 rather than int8: its draft law differs from the target's often enough that
        # rejections, and so the residual distribution, are exercised.
        "qspec-int4": lambda: ModelDrafter(target.quantized(4)),
        # The early exit writes draft rows into the target's own cache: the law must hold.
        "layerskip": lambda: ModelDrafter(target.early_exit(1)),
    }
    observed = sampled_outcomes(Engine(target, drafters[drafter]()), cfg)
    law = exact_joint(ExactLaw(tiny(str(models(SMALL)), n_ctx=64)), EXACT_PROMPT, cfg)  # type: ignore[arg-type]
    assert chi_square_pvalue(observed, law) > 1e-3


def test_greedy_speculation_with_a_torch_drafter_reproduces_plain_decoding(models) -> None:
    target = tiny(str(models(SMALL)))
    draft = tiny(str(models(replace(SMALL, noise=0.3))))
    prompt = "the sand and the"
    plain = runtime_for(target, strategy="none", calibrate=False).generate(prompt, max_tokens=40, temperature=0)
    for runtime in (
        runtime_for(target, draft, strategy="draft", draft_tokens=4, calibrate=False),
        runtime_for(target, target.early_exit(1), strategy="draft", draft_tokens=2, calibrate=False),
        runtime_for(target, strategy="ngram", draft_tokens=3, calibrate=False),
    ):
        spec = runtime.generate(prompt, max_tokens=40, temperature=0)
        assert spec.tokens == plain.tokens
        assert spec.stats.drafted > 0


@pytest.mark.parametrize("strategy", ["qspec", "qspec:int4"])
def test_greedy_speculation_with_a_qspec_self_drafter_reproduces_plain_decoding(models, strategy: str) -> None:
    target = tiny(str(models(SMALL)))
    prompt = "the sand and the"
    plain = runtime_for(target, strategy="none", calibrate=False).generate(prompt, max_tokens=40, temperature=0)
    kind, _, option = strategy.partition(":")
    drafter = target.make_self_drafter(kind, option or None)
    assert drafter is not None
    spec = runtime_for(target, drafter, strategy="draft", draft_tokens=3, calibrate=False).generate(
        prompt, max_tokens=40, temperature=0
    )
    assert spec.tokens == plain.tokens
    assert spec.stats.accepted > 0
    assert drafter.capabilities.extra["self_draft"] == f"qspec:{option or 'int8'}"


def test_a_qspec_drafter_owns_its_matrices_and_cache_and_shares_only_read_only_tensors(models) -> None:
    target = tiny(str(models(Spec("qwen2"))))  # QKV bias: carried over to the quantized copy
    before = blockwise(target, TEXT_IDS)
    drafter = target.quantized(8)
    mine, theirs = drafter.model.layers[0], target.model.layers[0]
    assert mine.wqkv is not theirs.wqkv and drafter.model.output is not target.model.output
    assert mine.attn_norm is theirs.attn_norm and drafter.model.embed is target.model.embed
    assert drafter.cache.k is not target.cache.k
    drafted = blockwise(drafter, TEXT_IDS)
    # int8 weights: close to the target, not equal, and the target is untouched.
    assert 0 < np.abs(drafted - before).max() < 0.05 * np.abs(before).max()
    np.testing.assert_array_equal(blockwise(target, TEXT_IDS), before)


def test_qspec_on_torch_names_the_types_it_takes(models) -> None:
    target = tiny(str(models(SMALL)))
    with pytest.raises(InvalidRequestError, match="int8 or int4"):
        target.make_self_drafter("qspec", "Q4_0")


@pytest.mark.parametrize("rows", [1, 3, 6, 7, 13, 16, 17, 40])
@pytest.mark.parametrize("kind", ["panels", "int8", "int4"])
def test_cpu_matrices_multiply_as_the_dense_weight_does(rows: int, kind: str) -> None:
    # 100 outputs: not a multiple of the 16-column panels; rows cross the kernel's 6-row
    # passes and its hand-over to the batched matmul.
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(100, 64, generator=generator)
    bias = torch.randn(100, generator=generator)
    x = torch.randn(rows, 64, generator=generator)
    matrix = {"panels": Panels, "int8": Int8, "int4": Int4}[kind](weight, bias)
    reference = torch.nn.functional.linear(x, matrix.dense(), bias)
    torch.testing.assert_close(matrix(x), reference, rtol=1e-4, atol=1e-4)
    ids = torch.tensor([0, 17, 99])
    torch.testing.assert_close(matrix.rows(ids), matrix.dense()[ids])


@pytest.mark.parametrize("rows", [1, 3, 6, 7, 16, 17, 40])
def test_a_half_precision_matrix_is_kept_in_half_panels_and_multiplies_exactly(rows: int, monkeypatch) -> None:
    if native.kernels() is None:
        pytest.skip("no C compiler or no AVX2: float32 panels and the batched matmul only")
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(100, 64, generator=generator).half().float()  # an F16 file's values
    x = torch.randn(rows, 64, generator=generator)
    half = Panels(weight, None)
    assert half.panels.dtype == torch.float16
    monkeypatch.setattr(linear, "exactly_half", lambda w: False)
    full = Panels(weight, None)
    assert full.panels.dtype == torch.float32
    # Widening a half is exact and the kernel's order of operations is the same: equal bits
    # up to 16 rows; longer blocks (prefill) go through the kernel too, where float32 panels
    # take the batched matmul.
    if rows <= 16:
        assert torch.equal(half(x), full(x))
    torch.testing.assert_close(half(x), torch.nn.functional.linear(x, weight), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(half.rows(torch.tensor([0, 17, 99])), weight[[0, 17, 99]], rtol=0, atol=0)
    assert torch.equal(half.dense(), weight)


def test_a_matrix_with_values_beyond_half_precision_stays_float32() -> None:
    if native.kernels() is None:
        pytest.skip("no C compiler or no AVX2")
    weight = torch.randn(32, 64).half().float()
    weight[3, 5] += 1e-4  # one value half precision cannot hold
    assert Panels(weight, None).panels.dtype == torch.float32
    assert Panels(torch.full((16, 64), 1e6), None).panels.dtype == torch.float32  # beyond half's range


def test_an_f16_gguf_runs_on_half_panels_with_the_float32_logits(models, monkeypatch) -> None:
    if native.kernels() is None:
        pytest.skip("no C compiler or no AVX2")
    path = str(models(Spec("llama", half=True)))
    target = tiny(path)
    assert target.model.output.panels.dtype == torch.float16  # type: ignore[attr-defined]
    ours = blockwise(target, TEXT_IDS)
    monkeypatch.setattr(linear, "exactly_half", lambda w: False)
    reference = tiny(path)
    assert reference.model.output.panels.dtype == torch.float32  # type: ignore[attr-defined]
    # Blocks of up to 13 tokens: every matrix goes through the same kernel either way.
    np.testing.assert_array_equal(ours, blockwise(reference, TEXT_IDS))


def test_a_long_int8_block_stays_on_the_native_kernel(monkeypatch) -> None:
    # torch's int8 operator costs ~60 ms a row on this CPU: a drafter's prefill through it
    # took 10 s for a 165-token prompt.
    if native.kernels() is None:
        pytest.skip("no C compiler or no AVX2: the operator is the only int8 path here")
    matrix = Int8(torch.randn(100, 64), None)

    def refuse(*args: object) -> torch.Tensor:
        raise AssertionError("a block of 40 rows went through torch's int8 operator")

    monkeypatch.setattr(torch.ops.aten, "_weight_int8pack_mm", refuse)
    assert matrix(torch.randn(40, 64)).shape == (40, 100)


def test_a_long_int4_block_does_not_go_row_by_row_through_torchs_kernel(monkeypatch) -> None:
    # torch's CPU int4 kernel costs ~2 ms a row per matrix here: a 165-token prefill of a
    # SmolLM2-135M drafter through it would take most of a minute.
    matrix = Int4(torch.randn(100, 64), None)
    single = matrix(torch.ones(1, 64))

    def refuse(*args: object) -> torch.Tensor:
        raise AssertionError("a block of 40 rows went through torch's int4 kernel")

    monkeypatch.setattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", refuse)
    block = matrix(torch.ones(40, 64))
    torch.testing.assert_close(block, single.expand(40, -1), rtol=1e-4, atol=1e-4)


def test_the_native_kernels_compute_what_the_torch_operators_do(models, monkeypatch) -> None:
    for spec in (Spec("llama"), Spec("gemma3")):
        path = str(models(spec))
        native_logits = blockwise(tiny(path), TEXT_IDS)
        monkeypatch.setattr(native, "kernels", lambda: None)
        operator_logits = blockwise(tiny(path), TEXT_IDS)
        monkeypatch.undo()
        np.testing.assert_allclose(native_logits, operator_logits, rtol=1e-4, atol=1e-4)


def test_an_early_exit_view_is_the_model_cut_after_its_first_blocks(models) -> None:
    # The random weights are drawn layer by layer, so a 2-block model's blocks are the
    # 3-block model's first two.
    full = tiny(str(models(Spec("llama"))))
    view = full.early_exit(2)
    shallow = tiny(str(models(Spec("llama", layers=2))))
    np.testing.assert_allclose(blockwise(view, TEXT_IDS), blockwise(shallow, TEXT_IDS), rtol=1e-5, atol=1e-5)
    assert view.info.n_layers == 2 and full.info.n_layers == 3
    assert full.n_past == 0  # the view wrote only rows past its host's tokens
    assert view.capabilities.extra["self_draft"] == "layerskip:2"


def test_an_early_exit_view_reads_the_targets_cache_and_never_writes_its_rows(models) -> None:
    target = tiny(str(models(Spec("llama"))))
    view = target.early_exit(2)
    assert view.cache is target.cache  # no cache of its own
    target.eval_block(TEXT_IDS[:20], "none")
    rows = target.cache.k[:, :, :20].clone(), target.cache.v[:, :, :20].clone()
    # The view holds the target's text without evaluating it, and drafts past it.
    assert list(view.cached_tokens()) == TEXT_IDS[:20]
    drafted = view.eval_block(TEXT_IDS[20:23], "all")
    assert view.n_past == 23 and target.n_past == 20
    assert torch.equal(target.cache.k[:, :, :20], rows[0]) and torch.equal(target.cache.v[:, :, :20], rows[1])
    # What it drafted is what the cut model computes over the whole text.
    shallow = tiny(str(models(Spec("llama", layers=2))))
    reference = blockwise(shallow, TEXT_IDS[:23], [20, 3])[20:]
    np.testing.assert_allclose(drafted, reference, rtol=1e-5, atol=1e-5)
    # Once the target writes (a verify pass over those positions), the view's rows are gone.
    target.eval_block(TEXT_IDS[20:21], "all")
    assert view.n_past == 21
    # Forgetting shared rows forgets them for both.
    view.rollback(10)
    assert target.n_past == 10 and view.n_past == 10


@pytest.mark.parametrize("spec", [Spec("llama"), Spec("gemma3")], ids=["llama", "gemma3"])
def test_verify_resumes_from_the_early_exits_work_and_stays_exact(models, spec: Spec, monkeypatch) -> None:
    target = tiny(str(models(spec)))
    prompt = "the sand and the"
    plain = runtime_for(target, strategy="none", calibrate=False).generate(prompt, max_tokens=30, temperature=0)
    passes: list[tuple[int, int | None, int]] = []
    layers_from = target.model.layers_from

    def spy(x, block, cache, start, end=None):  # type: ignore[no-untyped-def]
        passes.append((start, end, x.shape[0]))
        return layers_from(x, block, cache, start, end)

    monkeypatch.setattr(target.model, "layers_from", spy)
    runtime = runtime_for(target, target.early_exit(2), strategy="draft", draft_tokens=3, calibrate=False)
    spec_run = runtime.generate(prompt, max_tokens=30, temperature=0)
    assert spec_run.tokens == plain.tokens
    assert spec_run.stats.drafted > 0
    # Verify passes that start at the exit: the target did not run blocks 0-1 again for the
    # tokens the drafter had evaluated (one such pass per step that drafted).
    resumed = [rows for start, end, rows in passes if start == 2]
    assert len(resumed) == spec_run.stats.verify_steps - spec_run.stats.gamma_histogram.get(0, 0)
    assert all(rows >= 2 for rows in resumed)


def test_layerskip_without_a_count_measures_the_exits_once(models, temporary_localspec_home: Path, monkeypatch) -> None:
    from localspec.control import selfdraft

    target = tiny(str(models(Spec("llama", layers=6, local=(False,) * 6))))
    drafter = target.make_self_drafter("layerskip", None)
    assert drafter is not None
    chosen = drafter.capabilities.extra["self_draft"]
    assert chosen in {f"layerskip:{k}" for k in selfdraft.exit_candidates(6)} and len(selfdraft.exit_candidates(6)) > 1
    monkeypatch.setattr(selfdraft, "agreement", lambda *args: pytest.fail("measured again"))
    again = target.make_self_drafter("layerskip", None)
    assert again is not None and again.capabilities.extra["self_draft"] == chosen


# -- selection by name ------------------------------------------------------------------------


def test_the_cli_runs_the_torch_backend(models, capsys) -> None:
    path = models(SMALL)
    args = ["run", "--backend", "torch", "--model", str(path), "--threads", "1", "--raw", "the", "-n", "6", "-t", "0"]
    code = main(args)
    assert code == 0
    assert capsys.readouterr().out.strip()


def test_a_missing_torch_install_names_the_install_command(monkeypatch) -> None:
    for name in [
        m for m in sys.modules if m == "localspec.backends.torch" or m.startswith("localspec.backends.torch.")
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` sees without PyTorch
    with pytest.raises(BackendUnavailableError, match=r"pip install 'localspec\[torch\]'"):
        load_backend("torch", "model.gguf")


def test_an_unsupported_architecture_names_the_backend_that_runs_it(models, tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(path), "phi3")
    writer.add_token_list(["a"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(Exception, match=r"does not run the 'phi3' architecture[\s\S]*--backend llamacpp"):
        tiny(str(path))
