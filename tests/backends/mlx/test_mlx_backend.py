"""The MLX backend speaks the Backend protocol exactly, so speculation on it is lossless.

On the real SmolLM2-135M (the default GGUF, loaded by MLX with its Q4_1/Q8_0 weights kept
quantized): the tokenizer matches llama.cpp's id for id, teacher-forced top-1 predictions
agree with llama.cpp's, a rolled-back cache continues exactly like a fresh one, and greedy
speculation (n-gram, separate draft model) emits what plain decoding emits. MLX on a CPU
is slow (its matmuls do not use BLAS), so these use short texts.

Tiny random mlx-lm models (the mlx-lm way: known structure, the target as its own drafter)
cover what needs many runs or special architectures: sampled output follows the target's
law (chi-square, as in test_exactness.py), the in-memory self-drafters, an mlx-lm folder,
GGUF tensor types MLX cannot keep quantized, and a recurrent model rolling back.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from scipy.stats import chisquare

mx = pytest.importorskip(
    "mlx.core", reason="the MLX backend needs mlx: pip install 'localspec[mlx]' (mlx[cpu] on Linux)"
)
pytest.importorskip("mlx_lm", reason="the MLX backend needs mlx-lm: pip install 'localspec[mlx]'")

import mlx.nn as nn  # noqa: E402
from mlx_lm.models import llama, mamba  # noqa: E402

from localspec.api import Completion, runtime_for  # noqa: E402
from localspec.backends.mlx import Forward, MlxBackend, load  # noqa: E402
from localspec.backends.mlx.gguf import FrequencyRoPE, check_types  # noqa: E402
from localspec.backends.vocab import CONTROL, NORMAL, from_gguf  # noqa: E402
from localspec.control.policy import FixedDraftLength  # noqa: E402
from localspec.core.backend_loader import load_backend  # noqa: E402
from localspec.core.engine import Engine, Step  # noqa: E402
from localspec.core.errors import InvalidRequestError, ModelLoadError  # noqa: E402
from localspec.core.protocol import Backend  # noqa: E402
from localspec.core.sampling import SamplingConfig, process  # noqa: E402
from localspec.core.stats import Stats  # noqa: E402
from localspec.drafters import common_prefix  # noqa: E402
from localspec.drafters.model import ModelDrafter  # noqa: E402

N_CTX = 512
NEAR_TIE = 1e-2  # as in test_llamacpp_greedy.py: logits this close may swap between block shapes
# llama.cpp's Q4_1 kernels round activations to 8 bits: its logits move by up to about 1 (mean
# 0.16) from the float computation of the same weights, enough to flip a top-1 at a gap of
# 0.65 (seen). Its F16 expansion computes with float activations, like MLX; it only rounds
# the dequantized weights to half precision: a float-level near-tie at most.
F16_ROUNDING = 0.1

# -- the real model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlx_target(smollm2_gguf: Path) -> Iterator[Backend]:
    backend = load(str(smollm2_gguf), n_ctx=N_CTX)
    yield backend
    backend.close()


AGREEMENT_TEXT = (
    "The Rhine is one of the major European rivers. It begins in the Swiss Alps, flows along the borders "
    "of Switzerland, Austria and Germany, then through the Rhineland, and empties into the North Sea. "
    "For centuries it has carried barges of coal, grain and timber between the cities on its banks.\n\n"
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n"
    "    return total / len(values)\n\n"
    "print(mean([3, 5, 8, 13]))\n"
)


@pytest.fixture(scope="module")
def teacher_forced(mlx_target: Backend) -> tuple[list[int], np.ndarray]:
    """The agreement text and the MLX logits after each of its tokens, in one block."""
    tokens = mlx_target.tokenize(AGREEMENT_TEXT, add_special=True, parse_special=False)
    mlx_target.rollback(0)
    return tokens, mlx_target.eval_block(tokens, "all").copy()


# ids, bytes, specials and the template against llama.cpp: test_vocab_parity.py


@pytest.fixture(scope="module")
def llamacpp_f16_logits(teacher_forced: tuple[list[int], np.ndarray], derived_models: Any) -> np.ndarray:
    """llama.cpp's logits after each agreement token on the F16 expansion of the default GGUF:
    the same weights computed with float activations, as MLX does (its Q4_1 kernels round
    activations to 8 bits)."""
    reference = load_backend("llamacpp", str(derived_models["F16"]), n_ctx=N_CTX)
    try:
        return reference.eval_block(teacher_forced[0], "all").copy()
    finally:
        reference.close()


@pytest.mark.model
def test_top1_agrees_with_llamacpp_on_the_same_weights(
    teacher_forced: tuple[list[int], np.ndarray], llamacpp_f16_logits: np.ndarray
) -> None:
    tokens, mlx_logits = teacher_forced
    llama_logits = llamacpp_f16_logits
    assert len(tokens) >= 100
    agree = float(np.mean(mlx_logits.argmax(axis=1) == llama_logits.argmax(axis=1)))
    assert agree >= 0.99, f"top-1 agreement {agree:.3f} over {len(tokens)} positions"


@pytest.mark.model
def test_top1_differs_from_llamacpp_q4_1_only_where_its_own_float_run_does(
    teacher_forced: tuple[list[int], np.ndarray], target_backend: Backend, llamacpp_f16_logits: np.ndarray
) -> None:
    # A gap threshold alone is not enough: llama.cpp's 8-bit activations move its Q4_1 logits
    # by up to about 1. Where MLX's top-1 differs, llama.cpp computing the same weights with
    # float activations (the F16 expansion) must lean MLX's way too, or be at a near-tie.
    tokens, mlx_logits = teacher_forced
    target_backend.rollback(0)
    q4_1 = target_backend.eval_block(tokens, "all").copy()
    target_backend.rollback(0)
    f16 = llamacpp_f16_logits
    theirs, ours = q4_1.argmax(axis=1), mlx_logits.argmax(axis=1)
    rows = np.flatnonzero(theirs != ours)
    assert len(rows) <= 0.03 * len(tokens), f"{len(rows)} of {len(tokens)} positions differ"
    float_gaps = f16[rows, theirs[rows]] - f16[rows, ours[rows]]
    assert (float_gaps < F16_ROUNDING).all(), f"llama.cpp F16 gaps where the top-1 differs: {float_gaps}"


def test_rollback_continues_exactly_like_the_first_pass(
    mlx_target: Backend, teacher_forced: tuple[list[int], np.ndarray]
) -> None:
    tokens, first_pass = teacher_forced
    keep = common_prefix(mlx_target.cached_tokens(), tokens[:-6])  # reuse what the cache holds
    mlx_target.rollback(keep)
    mlx_target.eval_block(tokens[keep:-6], "none")
    mlx_target.eval_block([17, 42, 99], "none")  # a rejected draft, written into the cache
    mlx_target.rollback(len(tokens) - 6)
    assert list(mlx_target.cached_tokens()) == tokens[:-6]
    again = mlx_target.eval_block(tokens[-6:], "all")
    np.testing.assert_allclose(again, first_pass[-6:], atol=1e-3)
    assert (again.argmax(axis=1) == first_pass[-6:].argmax(axis=1)).all()
    assert mlx_target.n_past == len(tokens)


GREEDY_PROMPT = "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,"
GREEDY_TOKENS = 12


@pytest.fixture(scope="module")
def plain_greedy(mlx_target: Backend) -> Completion:
    return runtime_for(mlx_target, None, strategy="none", calibrate=False).generate(
        prompt=GREEDY_PROMPT, max_tokens=GREEDY_TOKENS, temperature=0
    )


def plain_logits_after(target: Backend, prompt: list[int], generated: list[int]) -> np.ndarray:
    """The logits plain decoding saw before its next token (prefill block, then single tokens)."""
    target.rollback(0)
    target.eval_block(prompt[:-1], "none")
    row = np.empty(0, dtype=np.float32)
    for token in [prompt[-1], *generated]:
        row = target.eval_block([token], "all")[-1].copy()
    return row


def assert_same_or_near_tie(target: Backend, plain: Completion, spec: Completion) -> None:
    n = min(len(plain.tokens), len(spec.tokens))
    i = next((k for k in range(n) if plain.tokens[k] != spec.tokens[k]), n)
    if i == n:
        assert len(plain.tokens) == len(spec.tokens)
        return
    prompt = target.tokenize(GREEDY_PROMPT, add_special=True, parse_special=False)
    row = plain_logits_after(target, prompt, plain.tokens[:i])
    gap = float(row[plain.tokens[i]] - row[spec.tokens[i]])
    assert 0 <= gap < NEAR_TIE, f"outright divergence at token {i}: logit gap {gap:.2e}"


@pytest.mark.parametrize("strategy", ["ngram", "draft"])
def test_greedy_speculation_emits_plain_decoding(
    strategy: str, mlx_target: Backend, plain_greedy: Completion, smollm2_gguf: Path
) -> None:
    draft = load(str(smollm2_gguf), n_ctx=N_CTX) if strategy == "draft" else None  # the same GGUF, loaded twice
    try:
        rt = runtime_for(mlx_target, draft, strategy=strategy, draft_tokens=3, calibrate=False)
        spec = rt.generate(prompt=GREEDY_PROMPT, max_tokens=GREEDY_TOKENS, temperature=0)
    finally:
        if draft is not None:
            draft.close()
    assert spec.stats.drafted > 0
    if strategy == "ngram":
        assert spec.stats.drafted > spec.stats.accepted > 0, "both acceptance and rejection must be exercised"
    assert_same_or_near_tie(mlx_target, plain_greedy, spec)


# -- tiny random models -----------------------------------------------------------------------

TINY_TOKENS = ["<|endoftext|>", "<|im_start|>", *"abcdefghijklmnopqrstu"]  # 23 tokens, one letter each
EOS, BOS = 0, 1


def tiny_vocab() -> Any:
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": TINY_TOKENS,
        "tokenizer.ggml.token_type": [CONTROL, CONTROL] + [NORMAL] * (len(TINY_TOKENS) - 2),
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.bos_token_id": BOS,
        "tokenizer.ggml.eos_token_id": EOS,
        "tokenizer.ggml.add_bos_token": True,
    }
    return from_gguf(meta, "tiny")


def tiny_llama(seed: int = 0, layers: int = 4, sharpness: float = 6.0) -> nn.Module:
    """A random llama whose next-token laws are peaked enough to give few outcome cells."""
    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=layers,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=len(TINY_TOKENS),
        tie_word_embeddings=False,
    )
    model = llama.Model(args)
    model.lm_head.weight = model.lm_head.weight * sharpness
    mx.eval(model.parameters())
    model.eval()
    return model


def tiny_backend(model: nn.Module, name: str = "tiny", n_ctx: int = 256) -> MlxBackend:
    return MlxBackend(Forward(model), tiny_vocab(), name=name, path=name, architecture="llama", n_ctx=n_ctx)


TINY_PROMPT = [BOS, 3, 4, 5, 6, 3, 4, 5]
STOP = -1
Outcome = tuple[int, int]


def first_two(
    engine: Engine, cfg: SamplingConfig, rng: np.random.Generator, stats: Stats, prompt: Sequence[int] = TINY_PROMPT
) -> Outcome:
    # Three tokens at most and γ = 2: the second token is either draft position 1 (both
    # accepted) or the target's own after a rejection or after a bonus.
    steps = engine.generate(prompt, 3, cfg, FixedDraftLength(2), stats, rng)
    tokens: list[int] = []
    with contextlib.closing(cast(Generator[Step, None, None], steps)):
        for step in steps:
            tokens += step.tokens
            if len(tokens) >= 2:
                break
    padded = [*tokens[:2], STOP, STOP]
    return padded[0], padded[1]


def exact_law(target: Backend, cfg: SamplingConfig, prompt: Sequence[int] = TINY_PROMPT) -> dict[Outcome, float]:
    """P(first two emitted tokens) from the target's own logits, STOP once it has ended."""
    eog = sorted(target.end_of_generation())
    vocab = target.info.n_vocab

    def dist(context: list[int]) -> np.ndarray:
        target.rollback(0)
        return process(target.eval_block(context, "last")[-1], cfg).dense(vocab)

    p1 = dist(list(prompt))
    law = {(STOP, STOP): float(p1[eog].sum())}
    for t1 in np.flatnonzero(p1).tolist():
        if t1 in eog:
            continue
        p2 = dist([*prompt, t1])
        law[(t1, STOP)] = float(p1[t1] * p2[eog].sum())
        law.update({(t1, t2): float(p1[t1] * p2[t2]) for t2 in np.flatnonzero(p2).tolist() if t2 not in eog})
    target.rollback(0)
    return law


def chi_square_pvalue(observed: Counter[Outcome], law: dict[Outcome, float]) -> float:
    """Pearson's test against an exact law, cells expected fewer than 5 times pooled."""
    if any(law.get(o, 0.0) == 0.0 for o in observed):
        return 0.0
    cells = [o for o, p in law.items() if p > 0]
    expected = np.array([law[o] for o in cells]) * sum(observed.values())
    counts = np.array([observed[o] for o in cells], dtype=np.float64)
    big = expected >= 5
    f_exp, f_obs = [*expected[big], expected[~big].sum()], [*counts[big], counts[~big].sum()]
    if f_exp[-1] < 5:  # too little to stand alone: fold it into the smallest cell
        i = int(np.argmin(f_exp[:-1]))
        f_exp[i], f_obs[i] = f_exp[i] + f_exp[-1], f_obs[i] + f_obs[-1]
        f_exp, f_obs = f_exp[:-1], f_obs[:-1]
    return float(chisquare(f_obs, np.array(f_exp) * sum(f_obs) / sum(f_exp)).pvalue)


TOP5 = SamplingConfig(temperature=0.9, top_k=5, top_p=1.0, min_p=0.0)
N_RUNS = 200  # the law puts 90% on three cells; test_exactness.py shows the test's power


@pytest.mark.parametrize(
    ("kind", "option"),
    # A 2-bit copy and a 1-block early exit: drafters that are often wrong.
    [("qspec", "2"), ("layerskip", "1")],
)
def test_sampled_tokens_follow_the_target_law_with_a_self_drafter(kind: str, option: str) -> None:
    target = tiny_backend(tiny_llama())
    drafter = target.make_self_drafter(kind, option)
    law = exact_law(target, TOP5)
    engine = Engine(target, ModelDrafter(drafter))
    observed: Counter[Outcome] = Counter()
    drafted = accepted = 0
    for run in range(N_RUNS):
        stats = Stats()
        observed[first_two(engine, TOP5, np.random.default_rng([20240611, run]), stats)] += 1
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > accepted > 0, "the runs must exercise both acceptance and rejection"
    assert chi_square_pvalue(observed, law) > 1e-3


@pytest.mark.parametrize("strategy", ["qspec:4", "layerskip:2"])
def test_self_drafters_reproduce_greedy_plain_decoding(strategy: str) -> None:
    target = tiny_backend(tiny_llama(seed=0))  # a greedy path the drafters partly miss
    plain = runtime_for(target, None, strategy="none", calibrate=False).generate(
        prompt="abcab", max_tokens=24, temperature=0
    )
    kind, _, option = strategy.partition(":")
    drafter = target.make_self_drafter(kind, option)
    assert drafter.capabilities.extra["self_draft"] == strategy
    spec = runtime_for(target, drafter, strategy="draft", draft_tokens=3, calibrate=False).generate(
        prompt="abcab", max_tokens=24, temperature=0
    )
    assert spec.stats.drafted > spec.stats.accepted > 0
    assert spec.tokens == plain.tokens


def test_layerskip_is_the_target_cut_after_its_first_blocks() -> None:
    full = tiny_llama(seed=1, layers=4)
    target = tiny_backend(full)
    drafter = target.make_self_drafter("layerskip", "2")
    cut = tiny_llama(seed=99, layers=2)
    cut.update(
        {"model": {"embed_tokens": full.model.embed_tokens, "layers": full.model.layers[:2], "norm": full.model.norm}}
    )
    cut.lm_head = full.lm_head
    tokens = [BOS, 5, 6, 7, 8, 9]
    np.testing.assert_allclose(drafter.eval_block(tokens), tiny_backend(cut).eval_block(tokens), atol=1e-5)
    shared = dict(target.model.parameters()["model"]["layers"][0]["mlp"]["up_proj"])  # type: ignore[attr-defined]
    assert cast(MlxBackend, drafter).model.model.layers[0].mlp.up_proj.weight is shared["weight"]
    assert drafter.info.n_layers == 2 and target.info.n_layers == 4


def test_layerskip_without_a_count_takes_the_measured_best_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.control import selfdraft

    # A short context: the agreement and drafting-time probes read texts cut to it (each pass
    # of MLX costs milliseconds even on a tiny model; at 256 they took 6 s).
    target = tiny_backend(tiny_llama(seed=1, layers=6), n_ctx=64)
    chosen = target.make_self_drafter("layerskip", None).capabilities.extra["self_draft"]
    assert chosen in {f"layerskip:{k}" for k in selfdraft.exit_candidates(6)}
    monkeypatch.setattr(selfdraft, "agreement", lambda *args: pytest.fail("measured again"))
    assert target.make_self_drafter("layerskip", None).capabilities.extra["self_draft"] == chosen


def test_qspec_copy_is_low_bit_and_leaves_the_target_alone() -> None:
    target = tiny_backend(tiny_llama(seed=2))
    tokens = [BOS, 5, 6, 7, 8, 9]
    before = target.eval_block(tokens)
    target.rollback(0)
    eight = target.make_self_drafter("qspec", "8")
    two = target.make_self_drafter("qspec", "2")
    assert cast(MlxBackend, two).model.layers[0].mlp.up_proj.bits == 2
    assert isinstance(target.model.layers[0].mlp.up_proj, nn.Linear)  # the target stays as it was
    np.testing.assert_array_equal(target.eval_block(tokens), before)
    close = eight.eval_block(tokens)
    assert np.abs(close - before).max() < 0.05 * np.abs(before).max()  # 8 bits: within rounding of the target
    assert (close.argmax(axis=1) == before.argmax(axis=1)).all()
    assert two.info.size_bytes < eight.info.size_bytes < target.info.size_bytes


def test_self_drafter_options_are_checked() -> None:
    target = tiny_backend(tiny_llama())
    with pytest.raises(InvalidRequestError, match="between 1 and 3 of 4"):
        target.make_self_drafter("layerskip", "4")
    with pytest.raises(InvalidRequestError, match="bit width"):
        target.make_self_drafter("qspec", "Q7")
    assert target.make_self_drafter("qspec", "Q4_0").capabilities.extra["self_draft"] == "qspec:4"
    assert target.make_self_drafter("qspec", None).capabilities.extra["self_draft"] == "qspec:4"  # float target


def test_a_runtime_loaded_in_one_thread_generates_in_another() -> None:
    # MLX streams are per thread (0.31.2+): the TUI and servers generate from worker threads.
    target = tiny_backend(tiny_llama(seed=0))
    drafter = target.make_self_drafter("layerskip", "2")
    rt = runtime_for(target, drafter, strategy="draft", draft_tokens=3, calibrate=False)
    here = rt.generate(prompt="abcab", max_tokens=12, temperature=0)
    there: list[Completion] = []
    worker = threading.Thread(target=lambda: there.append(rt.generate(prompt="abcab", max_tokens=12, temperature=0)))
    worker.start()
    worker.join()
    assert there and there[0].tokens == here.tokens


def tiny_mamba() -> nn.Module:
    mx.random.seed(0)
    args = mamba.ModelArgs(
        model_type="mamba",
        vocab_size=len(TINY_TOKENS),
        hidden_size=32,
        intermediate_size=64,
        state_size=8,
        num_hidden_layers=2,
        conv_kernel=4,
        use_bias=False,
        use_conv_bias=True,
        time_step_rank=4,
    )
    model = mamba.Model(args)
    mx.eval(model.parameters())
    return model


def test_a_recurrent_model_rolls_back_to_where_a_clean_pass_over_the_kept_tokens_is() -> None:
    # Mamba's state cannot be trimmed: it goes back to a mark taken before the block and the
    # kept tokens are replayed (hybrids and wrapped windows: test_mlx_hybrid.py).
    def backend() -> MlxBackend:
        return MlxBackend(Forward(model), tiny_vocab(), name="tiny-mamba", path="tiny", architecture="mamba", n_ctx=64)

    model = tiny_mamba()
    rolled, clean = backend(), backend()
    rolled.eval_block([BOS, 3, 4, 5, 6], "none")
    rolled.eval_block([7, 8, 9], "none")  # a draft, two of its tokens rejected
    rolled.rollback(6)
    assert rolled.cached_tokens() == [BOS, 3, 4, 5, 6, 7]
    np.testing.assert_allclose(
        rolled.eval_block([10, 11], "all"), clean.eval_block([BOS, 3, 4, 5, 6, 7, 10, 11], "all")[-2:], atol=1e-5
    )


def test_mlx_lm_folder_loads_like_the_model_saved_into_it(tmp_path: Path) -> None:
    from mlx_lm.utils import quantize_model, save_config, save_model

    model = tiny_llama(seed=4)
    config = {**vars(model.args)}
    model, config = quantize_model(model, config, group_size=32, bits=4)
    save_model(tmp_path, model)
    save_config(config, tmp_path / "config.json")
    vocab = tiny_vocab()
    vocab.tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|endoftext|>", "chat_template": "{{ messages }}"})
    )
    loaded = load(str(tmp_path), n_ctx=128)
    in_memory = tiny_backend(model)
    tokens = loaded.tokenize("abcabd", add_special=True, parse_special=False)
    assert tokens == in_memory.tokenize("abcabd", add_special=True, parse_special=False) == [BOS, 2, 3, 4, 2, 3, 5]
    np.testing.assert_array_equal(loaded.eval_block(tokens), in_memory.eval_block(tokens))
    assert loaded.capabilities.extra["quantization"] == "4-bit/32"
    assert loaded.end_of_generation() == {EOS}
    assert loaded.chat_template() == "{{ messages }}"
    assert loaded.vocab_identity() == in_memory.vocab_identity()


GGUF_TOKENS = [*TINY_TOKENS, "ab"]  # llama.cpp wants at least one merge: "a b" -> "ab"
GGUF_HIDDEN, GGUF_HEADS, GGUF_KV_HEADS, GGUF_HEAD_DIM, GGUF_FFN = 64, 4, 2, 16, 256


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    matrix_type: str = "F32",
    ffn_down_type: str | None = None,
    rope_freqs: bool = False,
) -> None:
    """A two-block GGUF of arch with random weights, written directly (no conversion): its
    matrices stored as matrix_type, ffn_down as zeros of ffn_down_type, and optionally the
    per-dimension rope frequency factors Llama 3.1+ files carry."""
    import gguf
    from gguf.quants import quant_shape_to_byte_shape, quantize

    types = gguf.GGMLQuantizationType
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(GGUF_HIDDEN)
    writer.add_feed_forward_length(GGUF_FFN)
    writer.add_head_count(GGUF_HEADS)
    writer.add_head_count_kv(GGUF_KV_HEADS)
    writer.add_key_length(GGUF_HEAD_DIM)
    writer.add_value_length(GGUF_HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(GGUF_TOKENS)
    writer.add_token_types([CONTROL, CONTROL] + [NORMAL] * (len(GGUF_TOKENS) - 2))
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    rng = np.random.default_rng(0)

    def add(name: str, *shape: int, scale: float = 0.2, kind: str = "F32") -> None:
        values = (rng.normal(size=shape) * scale).astype(np.float32)
        if kind == "F32":
            writer.add_tensor(name, values)
        elif kind == "Q8_0":
            writer.add_tensor(name, quantize(values, types.Q8_0), raw_dtype=types.Q8_0)
        else:  # types gguf-py cannot quantize: zero blocks are valid blocks
            raw = np.zeros(quant_shape_to_byte_shape(shape, types[kind]), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=types[kind])

    def ones(name: str, size: int) -> None:
        writer.add_tensor(name, (1 + 0.1 * rng.normal(size=size)).astype(np.float32))

    q_dim, kv_dim = GGUF_HEADS * GGUF_HEAD_DIM, GGUF_KV_HEADS * GGUF_HEAD_DIM
    add("token_embd.weight", len(GGUF_TOKENS), GGUF_HIDDEN, scale=1.0, kind=matrix_type)
    add("output.weight", len(GGUF_TOKENS), GGUF_HIDDEN, kind=matrix_type)
    ones("output_norm.weight", GGUF_HIDDEN)
    if rope_freqs:
        writer.add_tensor("rope_freqs.weight", np.linspace(1.0, 8.0, GGUF_HEAD_DIM // 2).astype(np.float32))
    for i in range(2):
        ones(f"blk.{i}.attn_norm.weight", GGUF_HIDDEN)
        ones(f"blk.{i}.ffn_norm.weight", GGUF_HIDDEN)
        for name, rows, cols in (("attn_q", q_dim, GGUF_HIDDEN), ("attn_k", kv_dim, GGUF_HIDDEN),
                                 ("attn_v", kv_dim, GGUF_HIDDEN), ("attn_output", GGUF_HIDDEN, q_dim),
                                 ("ffn_gate", GGUF_FFN, GGUF_HIDDEN), ("ffn_up", GGUF_FFN, GGUF_HIDDEN)):  # fmt: skip
            add(f"blk.{i}.{name}.weight", rows, cols, kind=matrix_type)
        add(f"blk.{i}.ffn_down.weight", GGUF_HIDDEN, GGUF_FFN, kind=ffn_down_type or matrix_type)
        if arch == "qwen2":
            for name, size in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
                add(f"blk.{i}.{name}.bias", size)
        if arch == "qwen3":
            ones(f"blk.{i}.attn_q_norm.weight", GGUF_HEAD_DIM)
            ones(f"blk.{i}.attn_k_norm.weight", GGUF_HEAD_DIM)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    ("arch", "rope_freqs"),
    [("llama", False), ("llama", True), ("qwen2", False), ("qwen3", False)],
    ids=["llama", "llama-rope-freqs", "qwen2", "qwen3"],
)
def test_gguf_architectures_give_llamacpps_logits(arch: str, rope_freqs: bool, tmp_path: Path) -> None:
    # The same file through both backends: tensor names, rope layout (llama.cpp's permuted
    # Q/K for llama, NEOX for qwen), biases, q/k norms and frequency factors all line up.
    pytest.importorskip("llama_cpp", reason="the comparison needs llama-cpp-python")
    path = tmp_path / f"tiny-{arch}.gguf"
    write_tiny_gguf(path, arch, rope_freqs=rope_freqs)
    reference, ours = load_backend("llamacpp", str(path), n_ctx=64), load(str(path), n_ctx=64)
    try:
        tokens = [BOS, 5, 9, 3, 12, 7, 7, 20, 4, 23]
        expected = reference.eval_block(tokens, "all").copy()
        np.testing.assert_allclose(ours.eval_block(tokens, "all"), expected, atol=0.03)
    finally:
        reference.close()


def test_gguf_types_mlx_dequantizes_are_announced(tmp_path: Path) -> None:
    path = tmp_path / "tiny-q6k.gguf"
    write_tiny_gguf(path, matrix_type="Q8_0", ffn_down_type="Q6_K")
    with pytest.warns(UserWarning, match="2 Q6_K tensors .* were dequantized to float16"):
        backend = load(str(path))
    assert backend.capabilities.extra["dequantized"] == "Q6_K:2"
    assert cast(MlxBackend, backend).model.layers[0].mlp.up_proj.bits == 8  # Q8_0 stays quantized
    assert backend.eval_block([BOS, 3, 4], "last").shape == (1, len(GGUF_TOKENS))


def test_gguf_types_mlx_cannot_read_are_refused_before_loading(tmp_path: Path) -> None:
    path = tmp_path / "tiny-q5k.gguf"
    write_tiny_gguf(path, matrix_type="Q8_0", ffn_down_type="Q5_K")
    with pytest.raises(ModelLoadError, match="MLX cannot read Q5_K tensors"):
        load(str(path))
    assert check_types("x", {"a": "Q4_0", "b": "F32", "c": "Q4_K"}) == {"Q4_K": 1}


def test_frequency_factors_of_one_are_plain_traditional_rope() -> None:
    x = mx.random.normal((1, 2, 5, 16))
    plain = nn.RoPE(16, traditional=True, base=10000.0)(x, offset=3)
    factored = FrequencyRoPE(16, 10000.0, True, mx.ones(8))(x, offset=3)
    np.testing.assert_allclose(np.array(factored), np.array(plain), atol=1e-5)


@pytest.mark.parametrize(
    ("system", "machine", "expected"),
    [("darwin", "x86_64", "Intel processor"), ("win32", "AMD64", "not on win32"), ("darwin", "arm64", None)],
)
def test_machines_mlx_cannot_run_on_are_named(
    system: str, machine: str, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import platform
    import sys

    from localspec.backends.mlx import unavailable_reason

    monkeypatch.setattr(sys, "platform", system)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    reason = unavailable_reason()
    assert reason is None if expected is None else expected in str(reason)


def test_an_image_sent_to_the_mlx_backend_is_refused_saying_it_reads_text_only(mlx_target: Backend) -> None:
    from localspec.testing.vision_writer import png_bytes

    image = {"type": "image", "data": png_bytes(24, 20)}
    rt = runtime_for(mlx_target, None, strategy="none", calibrate=False)
    with pytest.raises(InvalidRequestError, match="reads text only on the mlx backend") as refused:
        rt.generate(messages=[{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}])
    assert "--mmproj" in str(refused.value.hint) and "llama.cpp" in str(refused.value.hint)
