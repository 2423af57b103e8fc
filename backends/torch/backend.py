"""The torch backend behind the Backend protocol: one model, one static KV cache, a record of
the tokens it holds, and logits handed to the engine as float32 numpy arrays."""

from __future__ import annotations

import copy
import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import numpy as np
import torch

from localspec.common.gguf_header import check_gguf, read_header
from localspec.control.hardware import physical_cores
from localspec.control.selfdraft import early_exit_drafter
from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.protocol import Backend, Capabilities, Logits, LogitsMode, ModelInfo, TextFromVocab
from localspec.core.records import check_block, check_open, check_rollback
from localspec.core.sampling import Distribution, SamplingConfig

from ..vocab import Vocab, from_folder, from_gguf
from . import linear, native, quantized
from . import weights as wts
from .config import ModelConfig
from .layers import Block, KVCache, Model, eager_block, static_block

if TYPE_CHECKING:
    from .cuda import GraphedSteps

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Source:
    """A model on disk, read far enough to know what it is; `read` streams its tensors."""

    config: ModelConfig
    vocab: Vocab
    read: Callable[[wts.TensorSink, str | None], None]  # (sink, low-bit kind for GGUF matrices)
    name: str
    path: str
    file_type: str | None = None  # GGUF general.file_type (what self-drafting derives from)


def open_source(path: str) -> Source:
    folder = Path(path)
    if folder.is_dir():
        config, raw = wts.hf_config(folder)
        vocab = from_folder(folder, raw)
        return Source(
            config, vocab, lambda sink, kind: wts.read_hf_tensors(folder, config, raw, sink), folder.name, str(folder)
        )
    check_gguf(path)
    file = read_header(path)
    config = wts.gguf_config(file.meta)
    vocab = from_gguf(file.meta, path)
    file_type = str(file.meta.get("general.file_type", 1))
    return Source(
        config,
        vocab,
        lambda sink, kind: wts.read_gguf_tensors(file, config, sink, kind),
        os.path.basename(path),
        path,
        file_type,
    )


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# GGUF general.file_type -> the low-bit layout its matrices go into on CUDA: 4-bit files into
# int4, 5/6/8-bit ones into int8 (quantized.py says which conversions are exact).
INT4_FILE_TYPES = {"2", "3", "14", "15"}  # Q4_0, Q4_1, Q4_K_S, Q4_K_M
INT8_FILE_TYPES = {"7", "16", "17", "18"}  # Q8_0, Q5_K_S, Q5_K_M, Q6_K
WEIGHT_FORMATS = ("auto", "dense", "int4", "int8")
EMBEDDING = "token_embd.weight"  # a table read by rows: stays dense unless it is the head


def pick_weights(weights: str, device: torch.device, dtype: torch.dtype, file_type: str | None) -> str:
    """auto: a quantized GGUF stays low-bit on CUDA in bfloat16 (the kernels' type); the CPU
    keeps its own kernels and every other case is dense."""
    if weights not in WEIGHT_FORMATS:
        raise InvalidRequestError(f"unknown weights {weights!r}", f"choose one of: {', '.join(WEIGHT_FORMATS)}")
    if weights != "auto":
        return weights
    if device.type != "cuda" or dtype != torch.bfloat16:
        return "dense"
    return "int4" if file_type in INT4_FILE_TYPES else "int8" if file_type in INT8_FILE_TYPES else "dense"


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32  # without AVX-512 BF16 / AMX, bfloat16 matmuls are slower on a CPU
    if dtype not in DTYPES:
        raise InvalidRequestError(f"unknown dtype {dtype!r}", f"choose one of: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


class TorchOptions(TypedDict, total=False):
    """TorchBackend's options, as load_backend("torch", path, **options) passes them."""

    n_ctx: int
    threads: int | None
    max_block: int
    device: str
    dtype: str
    cuda_graphs: bool
    compile: bool
    graph_tokens: int
    static: bool
    verify_on_device: bool | None
    weights: str


@dataclass(frozen=True)
class TorchSettings:
    """TorchBackend's options with their defaults (TorchBackend's docstring says what each means)."""

    n_ctx: int = 4096
    threads: int | None = None
    max_block: int = 512
    device: str = "auto"
    dtype: str = "auto"
    cuda_graphs: bool = True
    compile: bool = False
    graph_tokens: int = 16
    static: bool = False
    verify_on_device: bool | None = None
    weights: str = "auto"


class TorchBackend(TextFromVocab):
    """One model with its own static KV cache, on the CPU or a CUDA GPU.

    Options: n_ctx (capped at the model's training length), threads (CPU; default one per
    physical core), max_block, device ("auto", "cpu", "cuda", "cuda:1"), dtype ("auto",
    "float32", "bfloat16", "float16"), cuda_graphs (replay decode/verify steps of up to
    `graph_tokens` tokens from captured CUDA graphs; default on for CUDA), compile (also
    torch.compile those steps), static (the graph-ready forward without capturing: for tests),
    verify_on_device (the engine's acceptance rule runs on the model's device, verify.py;
    default on for CUDA, where it spares each step a full-vocabulary copy to the host),
    weights ("auto", "dense", "int4", "int8": the matrices' layout; auto keeps a 4-bit GGUF in
    int4 and a 5-8-bit one in int8 on CUDA, read by torch's low-bit kernels, see
    pick_weights; explicit int4/int8 work on the CPU too, through torch's CPU kernels).
    """

    def __init__(self, path: str, **options: Unpack[TorchOptions]) -> None:
        o = TorchSettings(**options)
        n_ctx, threads = o.n_ctx, o.threads
        source = open_source(path)
        self._device = pick_device(o.device)
        self._dtype = pick_dtype(o.dtype, self._device)
        # The build (torch and CUDA versions) keys cached calibrations: an upgrade changes kernels.
        build = f"torch {torch.__version__}" + (f" cuda {torch.version.cuda}" if torch.version.cuda else "")
        extra = {"device": str(self._device), "dtype": str(self._dtype).removeprefix("torch."), "build": build}
        if source.file_type is not None:
            extra["file_type"] = source.file_type
        if self._device.type == "cpu":
            threads = threads or physical_cores()
            torch.set_num_threads(threads)  # process-wide: every torch backend shares the cores
            extra["threads"] = str(threads)
            extra["kernels"] = native.describe()
        self._weights = pick_weights(o.weights, self._device, self._dtype, source.file_type)
        extra["weights"] = self._weights
        config = source.config
        n_ctx = min(n_ctx, config.context_length or n_ctx)
        self.model, n_params, n_bytes = self._build(source, n_ctx)
        self.cache = KVCache(config.n_layers, config.n_kv_heads, n_ctx, config.head_dim, self._dtype, self._device)
        self._positions = torch.arange(n_ctx, device=self._device)
        self.vocab = source.vocab
        self._n_vocab = self.model.output.out_features
        self._tokens: list[int] = []
        self._closed = False
        self._static = o.static
        self._init_views()
        self._graph_options = (o.graph_tokens, o.cuda_graphs, o.compile)
        self._graphs: GraphedSteps | None = None
        if self._device.type == "cuda" and (o.cuda_graphs or o.compile):
            self._graphs = self._graphed()
            extra["cuda_graphs"] = str(o.cuda_graphs)
            extra["compile"] = str(o.compile)
        self._describe(source, replace(o, n_ctx=n_ctx), (n_params, n_bytes), extra)

    def _init_views(self) -> None:
        """The state an early-exit drafter (a view of this model) and its host share."""
        self._exit: int | None = None  # run only the first blocks (an early-exit drafter)
        # An early-exit view reads and writes its host's KV cache for the blocks they share;
        # _writes counts the passes that wrote it, so a view knows when its own rows went.
        self._host: TorchBackend | None = None
        self._writes = 0
        self._seen = -1
        # What an early-exit view computed at its exit, per position: (token, exit, the host's
        # _writes then) and the hidden state. The host's next pass over those very tokens
        # starts there instead of running the shared blocks again.
        self._exits: dict[int, tuple[int, int, int]] = {}
        self._exit_states: torch.Tensor | None = None

    def _describe(self, source: Source, o: TorchSettings, sizes: tuple[int, int], extra: dict[str, str]) -> None:
        """info and capabilities: what the model is, and what its cost curve depends on."""
        config = source.config
        self.info = ModelInfo(
            name=source.name,
            path=os.path.abspath(source.path),
            backend="torch",
            architecture=config.architecture,
            n_ctx=o.n_ctx,
            n_vocab=self._n_vocab,
            size_bytes=sizes[1],
            n_params=sizes[0],
            n_layers=config.n_layers,
        )
        verifies = self._device.type == "cuda" if o.verify_on_device is None else o.verify_on_device
        self.capabilities = Capabilities(
            max_block=o.max_block, device=self._device.type, extra=extra, verifies=verifies
        )

    def _graphed(self) -> GraphedSteps:
        from .cuda import GraphedSteps

        tokens, graphs, compile = self._graph_options
        return GraphedSteps(self.model, self.cache, tokens, graphs, compile, self._exit)

    def make_self_drafter(self, kind: str, option: str | None) -> Backend:
        """localspec.core.protocol.SelfDrafting: layerskip[:L] is early_exit(L), qspec[:int8|int4]
        quantized(); the low-bit GGUF types llama.cpp's qspec derives would load dequantized
        to this model's float type, so they are refused with the types that do pay."""
        if kind == "layerskip":
            return early_exit_drafter(self, option, self.info.n_layers, self.early_exit)
        bits = {"int8": 8, "int4": 4}.get((option or "int8").lower())
        if bits is None:
            raise InvalidRequestError(
                f"qspec on the torch backend takes int8 or int4, got {option!r}", "use --strategy qspec:int8"
            )
        return self.quantized(bits)

    def early_exit(self, n_layers: int) -> TorchBackend:
        """This model cut after its first n_layers blocks, then its own final norm and head:
        a layer-skip self-drafter. It shares every weight, the tokenizer and the KV cache of
        those blocks with this backend: the keys and values of the committed text are the
        target's own (same blocks, same tokens), so the drafter never catches up on text and
        costs no cache memory of its own. It writes only rows past the target's tokens, and
        keeps its hidden states at the exit: the target's next pass over those very tokens
        resumes from them at block n_layers instead of running the shared blocks again."""
        config = self.model.config
        if not 0 < n_layers < config.n_layers:
            raise InvalidRequestError(f"an early exit must keep between 1 and {config.n_layers - 1} blocks")
        if self._host is not None:
            return self._host.early_exit(n_layers)
        return self._self_drafter(f"layerskip:{n_layers}", {"n_layers": n_layers}, _exit=n_layers, _host=self)

    def quantized(self, bits: int) -> TorchBackend:
        """This model with weight-only int8 (or int4) matrices: a QSpec-style self-drafter.
        The quantized matrices and the KV cache are its own; the embedding, norms, RoPE
        tables and tokenizer are this backend's, shared read-only (no forward pass writes to
        them). On CUDA its steps get CUDA graphs of their own, as the target's do."""
        factories: dict[int, linear.Factory] = {8: linear.Int8, 4: linear.Int4}
        if bits not in factories:
            raise InvalidRequestError(f"qspec on the torch backend takes int8 or int4, got int{bits}")
        config = self.model.config
        cache = KVCache(
            config.n_layers, config.n_kv_heads, self.cache.n_ctx, config.head_dim, self._dtype, self._device
        )
        size = self.info.size_bytes * bits // (8 * self.cache.k.element_size())  # the matrices dominate
        model = self.model.requantized(factories[bits])
        return self._self_drafter(f"qspec:int{bits}", {"size_bytes": size}, model=model, cache=cache)

    def _self_drafter(self, label: str, info: dict[str, Any], **fields: Any) -> TorchBackend:
        """A shallow copy of this backend named as the self-drafter `label`, holding no tokens
        and none of this backend's early-exit bookkeeping; `fields` replace its attributes
        (model, cache, _exit, _host) and `info` fields of its ModelInfo."""
        view = copy.copy(self)
        fresh = {"_tokens": [], "_closed": False, "_exit": None, "_host": None, "_writes": 0, "_seen": -1}
        vars(view).update({**fresh, "_exits": {}, "_exit_states": None, **fields})
        view._graphs = view._graphed() if self._graphs is not None else None
        view.info = replace(self.info, name=f"{self.info.name} [{label}]", **info)
        view.capabilities = replace(self.capabilities, extra={**self.capabilities.extra, "self_draft": label})
        return view

    def _build(self, source: Source, n_ctx: int) -> tuple[Model, int, int]:
        table: dict[str, quantized.Matrix] = {}
        counts = [0, 0]

        kind = None if self._weights == "dense" else self._weights

        names: set[str] = set()

        def sink(name: str, value: quantized.Matrix) -> None:
            names.add(name)
            if kind is not None and isinstance(value, torch.Tensor) and value.dim() == 2 and name != EMBEDDING:
                layout = quantized.head_kind(kind, quantized.F32) if name == "output.weight" else kind
                value = quantized.quantize_groups(value) if layout == "int4" else quantized.quantize_rows(value)
            if isinstance(value, torch.Tensor):
                # RoPE frequency factors stay float32; everything else takes the compute dtype.
                dtype = torch.float32 if name == "rope_freqs.weight" else self._dtype
                moved = table[name] = value.to(device=self._device, dtype=dtype)
                counts[0] += value.numel()
                counts[1] += value.numel() * moved.element_size()
            else:  # on the host until its matrix is packed on the device (linear.low_bit)
                table[name] = value
                out, width = value.codes.shape
                counts[0] += out * width
                layout = "int4" if isinstance(value, quantized.GroupCodes) else "int8"
                counts[1] += quantized.matrix_bytes(out, width, layout)

        source.read(sink, kind)
        module = importlib.import_module(f"{__package__}.{source.config.family}")
        factory = linear.for_device(self._device, self._dtype) if kind is None else linear.low_bit(self._device)
        try:
            model: Model = module.Model(source.config, table, n_ctx, factory)
        except KeyError as exc:
            raise ModelLoadError(f"{source.path} lacks the tensor {exc.args[0]}", "the file is incomplete") from exc
        if kind is not None and "output.weight" not in names and not model.output.cheap_rows:
            # A tied head kept low-bit reads its embedding rows from a dense copy of its own.
            counts[1] += model.config.vocab_size * model.config.hidden * self._cache_itemsize()
        return model, counts[0], counts[1]

    def _cache_itemsize(self) -> int:
        return torch.empty((), dtype=self._dtype).element_size()

    # -- description ------------------------------------------------------------------------

    def _sync(self) -> None:
        """An early-exit view holds its host's tokens, plus the rows it wrote past them as
        long as the host has not written since (the host's passes overwrite those rows)."""
        host = self._host
        if host is not None and host._writes != self._seen:
            self._tokens = list(host._tokens)
            self._seen = host._writes

    @property
    def n_past(self) -> int:
        self._sync()
        return len(self._tokens)

    def cached_tokens(self) -> Sequence[int]:
        self._sync()
        return self._tokens

    # -- evaluation -------------------------------------------------------------------------

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        if len(tokens) == 0:
            self._check(tokens, logits)
            return np.empty((0, self._n_vocab), dtype=np.float32)
        if self._graphs is not None and self._graphs.handles(len(tokens)):
            self._check(tokens, logits)
            with torch.inference_mode():
                out = self._graphs.run(tokens, self.n_past, logits)
            self._wrote(tokens)
            return out
        return to_numpy(self._evaluate(tokens, logits), self._n_vocab)

    def verify_block(
        self,
        tokens: Sequence[int],
        draft_dists: Sequence[Distribution] | None,
        cfg: SamplingConfig,
        rng: np.random.Generator,
    ) -> tuple[int, int]:
        """eval_block(tokens, "all") and the acceptance rule on the device (verify.py): only
        the two integers it returns come back to the host."""
        from . import verify

        if cfg.greedy and self._graphs is not None and self._graphs.handles(len(tokens)):
            from .cuda import GREEDY

            self._check(tokens, "all")
            with torch.inference_mode():
                outcome = self._graphs.run_on_device(tokens, len(self._tokens), GREEDY)
            self._wrote(tokens)
            n_acc, token = outcome.tolist()
            return int(n_acc), int(token)
        with torch.inference_mode():
            return verify.accept(tokens[1:], draft_dists, self._evaluate(tokens, "all"), cfg, rng)

    def _check(self, tokens: Sequence[int], logits: str) -> None:
        check_open(self._closed, self.info.name)
        self._sync()  # an early-exit view starts past its host's tokens
        check_block(tokens, logits, self.info, self.capabilities, len(self._tokens))

    def _evaluate(self, tokens: Sequence[int], logits: str) -> torch.Tensor:
        """The block's logits as a tensor on the model's device ([0, 0] for "none")."""
        self._check(tokens, logits)
        past = len(self._tokens)
        with torch.inference_mode():
            if self._graphs is not None and self._graphs.handles(len(tokens)):
                out = self._graphs.run_on_device(tokens, past, logits)
            else:
                out = self._forward(tokens, past, logits)
        self._wrote(tokens)
        return out

    def _wrote(self, tokens: Sequence[int]) -> None:
        self._tokens.extend(tokens)
        self._writes += 1

    def _block(self, past: int, n: int) -> Block:
        positions = self._positions[past : past + n]
        if self._static:
            return static_block(positions, self.cache.n_ctx, self.model.window, self._dtype)
        return eager_block(positions, past, n, self.model.window, self._dtype)

    def _forward(self, tokens: Sequence[int], past: int, logits: str) -> torch.Tensor:
        n = len(tokens)
        model = self.model
        ids = torch.tensor(tokens, dtype=torch.long, device=self._device)
        block = self._block(past, n)
        reused, exit = (0, 0) if self._host is not None else self._reusable(tokens, past)
        if reused:
            # The view drafted these tokens: their shared blocks' keys and values are in the
            # cache and their hidden states at the exit are kept; only the rest runs them.
            assert self._exit_states is not None
            x = self._exit_states[past : past + reused]
            if reused < n:
                rest = model.embedding(ids[reused:])
                x = torch.cat([x, model.layers_from(rest, self._block(past + reused, n - reused), self.cache, 0, exit)])
            x = model.layers_from(x, block, self.cache, exit)
        else:
            x = model.layers_from(model.embedding(ids), block, self.cache, 0, self._exit)
            if self._host is not None and self._exit is not None:
                self._host._keep_exit_states(tokens, past, x, self._exit)
        return model.head(x, logits)

    def _keep_exit_states(self, tokens: Sequence[int], past: int, x: torch.Tensor, exit: int) -> None:
        if self._exit_states is None:
            self._exit_states = torch.empty((self.cache.n_ctx, x.shape[1]), dtype=x.dtype, device=x.device)
        self._exit_states[past : past + len(tokens)] = x
        for i, token in enumerate(tokens):
            self._exits[past + i] = (token, exit, self._writes)

    def _reusable(self, tokens: Sequence[int], past: int) -> tuple[int, int]:
        """How many leading tokens of a block at `past` a view evaluated since this backend
        last wrote its cache, and at which exit."""
        first = self._exits.get(past)
        if first is None or first[0] != tokens[0] or first[2] != self._writes:
            return 0, 0
        exit, m = first[1], 1
        while m < len(tokens) and self._exits.get(past + m) == (tokens[m], exit, self._writes):
            m += 1
        return m, exit

    def rollback(self, n: int) -> None:
        # The cache rows past n stay allocated and are overwritten by the next block, so rows
        # a Ctrl+C left unrecorded are overwritten too: nothing needs clearing.
        check_open(self._closed, self.info.name)
        check_rollback(n)
        self._sync()
        if self._host is not None and n < self._host.n_past:
            self._host.rollback(n)  # those rows are shared: forgetting them is for both
        if n < len(self._tokens):
            del self._tokens[max(n, 0) :]

    def close(self) -> None:
        # The weights go with the last reference to them (an early-exit view shares them).
        self._closed = True
        if self._graphs is not None:
            self._graphs.release()
        self._graphs = None
        self._tokens = []


def to_numpy(out: torch.Tensor, n_vocab: int) -> Logits:
    """Logits as the float32 host array the Backend protocol hands out."""
    if out.shape[0] == 0:
        return np.empty((0, n_vocab), dtype=np.float32)
    if out.dtype != torch.float32 or out.device.type != "cpu":
        out = out.float().cpu()
    array: Logits = out.numpy()
    return array


def load(path: str, **options: Any) -> TorchBackend:
    return TorchBackend(path, **options)
