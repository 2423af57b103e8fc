"""The reference backend: a tiny numpy language model whose probabilities are known exactly.

The next-token logits depend on the last two tokens only,

    logits(t_{-2}, t_{-1}) = A[t_{-1}] + B[t_{-2}] + bias

with A, B and bias drawn from a seeded generator, so the target's distribution after any
context is a closed-form lookup. That makes speculative decoding testable for exactness
(the engine's output law must equal `exact_probs`), and fast enough for the CLI and TUI to
run without weights. `noise > 0` perturbs the tables with a second seed: a drafter that is
close to, but not the same as, the target, with the same tokenizer.

The tokenizer is bytes: byte b is token 3 + b % (vocab_size - 3), exact for the default
vocabulary of 259. Ids 0, 1, 2 are BOS, EOS and an end-of-turn token with no text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Capabilities, Exactness, Logits, LogitsMode, ModelInfo, VocabIdentity
from localspec.core.records import check_block, check_ids, check_open, check_rollback
from localspec.core.sampling import SamplingConfig, one_hot, process

BOS, EOS, END_OF_TURN = 0, 1, 2
N_SPECIAL = 3
# BOS is never a continuation; a finite floor (not -inf) keeps every logit row finite.
_NEVER = -1.0e4
# Share of the logit scale each table carries: the last token matters most.
_SCALE_A, _SCALE_B, _SCALE_BIAS = 0.8, 0.6, 0.2

_CHATML = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


class ReferenceBackend:
    """A seeded two-token-context language model; its cache is the list of tokens."""

    def __init__(
        self,
        vocab_size: int = 259,
        seed: int = 0,
        sharpness: float = 3.0,
        n_ctx: int = 2048,
        noise: float = 0.0,
        noise_seed: int = 1,
    ) -> None:
        _check_params(vocab_size, sharpness, n_ctx, noise)
        self._vocab = vocab_size
        self._a, self._b, self._bias = _tables(vocab_size, seed, sharpness, noise, noise_seed)
        self._tokens: list[int] = []
        self._tree: tuple[int, list[int]] = (0, [])  # the last eval_tree's start and tokens
        self._closed = False
        n_params = self._a.size + self._b.size + self._bias.size
        self.info = ModelInfo(
            name=_name(vocab_size, seed, noise),
            path=_spec(vocab_size, seed, sharpness, n_ctx, noise, noise_seed),
            backend="reference",
            architecture="bigram-ref",
            n_ctx=n_ctx,
            n_vocab=vocab_size,
            size_bytes=self._a.nbytes + self._b.nbytes + self._bias.nbytes,
            n_params=n_params,
        )
        # A gather has no batch limit: any block that fits the context is one call. Each
        # position's logits are a table lookup: a block's are one-token passes' exactly.
        self.capabilities = Capabilities(
            max_block=n_ctx, device="cpu", extra={"exact": "1"}, branches=n_ctx, exactness=Exactness(None)
        )

    # -- the model -------------------------------------------------------------------------

    def next_token_logits(self, prev2: int, prev1: int) -> Logits:
        """Logits after ... prev2, prev1; touches no cache. A context of one token reads
        prev2 as BOS, so [x] and [BOS, x] are continued the same way."""
        row: Logits = self._a[prev1] + self._b[prev2] + self._bias
        return row

    def exact_probs(self, context: Sequence[int], cfg: SamplingConfig) -> npt.NDArray[np.float64]:
        """The target's processed next-token distribution after context, dense over the vocab:
        what a correct sampler (speculative or not) must draw the next token from."""
        if not context:
            raise InvalidRequestError("exact_probs needs a context of at least one token")
        prev2 = context[-2] if len(context) > 1 else BOS
        row = self.next_token_logits(prev2, context[-1])
        dist = one_hot(int(np.argmax(row))) if cfg.greedy else process(row, cfg)
        return dist.dense(self._vocab)

    # -- Backend protocol ------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    def cached_tokens(self) -> Sequence[int]:
        return tuple(self._tokens)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        # parse_special changes nothing: the special tokens have no text to parse.
        raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        ids = (N_SPECIAL + raw % (self._vocab - N_SPECIAL)).tolist()
        return [BOS, *ids] if add_special else ids

    def token_bytes(self, token: int) -> bytes:
        check_ids([token], self.info.name, self._vocab)
        return b"" if token < N_SPECIAL else bytes([token - N_SPECIAL])

    def detokenize(self, tokens: Sequence[int]) -> str:
        check_ids(tokens, self.info.name, self._vocab)
        data = bytes(t - N_SPECIAL for t in tokens if t >= N_SPECIAL)
        return data.decode("utf-8", errors="replace")

    def vocab_identity(self) -> VocabIdentity:
        texts = tuple(self.token_bytes(t) for t in range(self._vocab))
        return VocabIdentity(kind="bytes", size=self._vocab, bos=BOS, eos=EOS, token_texts=texts)

    def end_of_generation(self) -> frozenset[int]:
        return frozenset({EOS, END_OF_TURN})

    def chat_template(self) -> str | None:
        return _CHATML

    def special_texts(self) -> dict[str, str]:
        return {"bos_token": "", "eos_token": ""}

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        check_open(self._closed, self.info.name)
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        check_block(ids, logits, self.info, self.capabilities, len(self._tokens))
        # Row i continues ids[i]; its second-to-last token is ids[i-1], or the cache's tail.
        prev2 = np.empty_like(ids)
        if ids.size:
            prev2[0] = self._tokens[-1] if self._tokens else BOS
            prev2[1:] = ids[:-1]
        self._tokens.extend(ids.tolist())
        if logits == "none" or ids.size == 0:
            return np.empty((0, self._vocab), dtype=np.float32)
        if logits == "last":
            ids, prev2 = ids[-1:], prev2[-1:]
        out: Logits = self._a[ids] + self._b[prev2] + self._bias
        return out

    def eval_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> Logits:
        """localspec.core.protocol.TreeBackend: a row's second-to-last token is its parent's."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        up = np.asarray(parents, dtype=np.int64).reshape(-1)
        if ids.size == 0 or up.shape != ids.shape or up[0] != -1 or not _ordered(up):
            raise InvalidRequestError("a tree needs one root (parent -1) first and every parent before its child")
        past = len(self._tokens)
        self.eval_block(tokens, "none")  # the checks, and the nodes held in the cache until keep_branch
        prev2 = np.where(up >= 0, ids[np.maximum(up, 0)], self._tokens[past - 1] if past else BOS)
        self._tree = (past, ids.tolist())
        out: Logits = self._a[ids] + self._b[prev2] + self._bias
        return out

    def keep_branch(self, path: Sequence[int]) -> None:
        past, nodes = self._tree
        self._tokens[past:] = [nodes[i] for i in path]

    def rollback(self, n: int) -> None:
        check_open(self._closed, self.info.name)
        check_rollback(n)
        del self._tokens[n:]

    def close(self) -> None:
        self._tokens.clear()
        self._closed = True


def _ordered(parents: npt.NDArray[np.int64]) -> bool:
    """Every node but the root has a parent before it."""
    return bool(np.all((parents[1:] >= 0) & (parents[1:] < np.arange(1, parents.size))))


def _check_params(vocab_size: int, sharpness: float, n_ctx: int, noise: float) -> None:
    if vocab_size <= N_SPECIAL:
        raise InvalidRequestError(
            f"vocab_size must be more than {N_SPECIAL} (BOS, EOS, end of turn), got {vocab_size}",
            "use 259 for an exact byte tokenizer",
        )
    if not (sharpness >= 0 and math.isfinite(sharpness)):
        raise InvalidRequestError(f"sharpness must be 0 or more, got {sharpness}", "use 3 for the default")
    if n_ctx < 1:
        raise InvalidRequestError(f"n_ctx must be 1 or more, got {n_ctx}")
    if not (noise >= 0 and math.isfinite(noise)):
        raise InvalidRequestError(f"noise must be 0 or more, got {noise}", "use 0 for the target itself")


def _tables(vocab: int, seed: int, sharpness: float, noise: float, noise_seed: int) -> tuple[Logits, Logits, Logits]:
    """A, B, bias in float32; noise is in units of the table's own spread, so noise=1 is a
    perturbation as large as the signal and any noise leaves the tokenizer untouched."""
    rng = np.random.default_rng(seed)
    shapes = ((vocab, vocab), (vocab, vocab), (vocab,))
    raw = [rng.standard_normal(shape) for shape in shapes]
    if noise > 0:
        noise_rng = np.random.default_rng(noise_seed)
        raw = [r + noise * noise_rng.standard_normal(r.shape) for r in raw]
    a, b, bias = (sharpness * scale * r for scale, r in zip((_SCALE_A, _SCALE_B, _SCALE_BIAS), raw, strict=True))
    bias[BOS] = _NEVER
    return a.astype(np.float32), b.astype(np.float32), bias.astype(np.float32)


def _name(vocab: int, seed: int, noise: float) -> str:
    return f"reference-v{vocab}-s{seed}" + (f"-noise{noise:g}" if noise else "")


def _spec(vocab: int, seed: int, sharpness: float, n_ctx: int, noise: float, noise_seed: int) -> str:
    """The load() spec that rebuilds this model: seed always, the rest when not default."""
    parts = [f"seed={seed}"]
    defaults: list[tuple[str, object, object]] = [
        ("vocab", vocab, 259),
        ("sharpness", sharpness, 3.0),
        ("n_ctx", n_ctx, 2048),
        ("noise", noise, 0.0),
        ("noise_seed", noise_seed, 1),
    ]
    parts += [f"{key}={value}" for key, value, default in defaults if value != default]
    return "reference:" + ",".join(parts)


# Spec key -> (constructor parameter, parser).
_OPTIONS: dict[str, tuple[str, type[int] | type[float]]] = {
    "seed": ("seed", int),
    "vocab": ("vocab_size", int),
    "vocab_size": ("vocab_size", int),
    "sharpness": ("sharpness", float),
    "n_ctx": ("n_ctx", int),
    "noise": ("noise", float),
    "noise_seed": ("noise_seed", int),
}


def load(spec: str, **options: Any) -> ReferenceBackend:
    """Build a reference model from "reference" or "reference:seed=3,vocab=16,noise=0.5".
    Keyword options (the runtime's n_ctx, say) fill in what the spec leaves out; the spec
    wins where both speak, since it names the model exactly."""
    head, _, rest = spec.partition(":")
    if head.strip() != "reference":
        raise InvalidRequestError(f"{spec!r} is not a reference model spec", "write it as reference:seed=0")
    pairs: list[tuple[str, Any]] = []
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise InvalidRequestError(f"reference option {item!r} has no value", f"write it as {item}=VALUE")
        pairs.append((key.strip(), value.strip()))
    # The runtime passes threads to every backend; a numpy gather has nothing to split.
    options.pop("threads", None)
    return ReferenceBackend(**{**_parse_options(options.items()), **_parse_options(pairs)})


def _parse_options(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for key, value in pairs:
        if key not in _OPTIONS:
            raise InvalidRequestError(f"unknown reference option {key!r}", f"known options: {', '.join(_OPTIONS)}")
        param, parse = _OPTIONS[key]
        try:
            kwargs[param] = parse(value)
        except (TypeError, ValueError):
            raise InvalidRequestError(f"reference option {key}={value!r} is not a valid {parse.__name__}") from None
    return kwargs
