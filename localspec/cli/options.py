"""Options several subcommands share, and the argparse types that check them: a bad value is
reported by argparse as a usage error naming the option."""

from __future__ import annotations

import argparse

from localspec.backends.llamacpp.rpc_server import RPC_HELP
from localspec.core.choices import BACKENDS, DraftTokens, Trees, parse_draft_tokens, parse_trees
from localspec.core.errors import InvalidRequestError
from localspec.core.options import LoadOptions
from localspec.core.sampling import KNOBS, SamplingConfig, check_knob
from localspec.core.validate import check_ctx, check_threads

DEFAULTS = SamplingConfig()

# How every command names a model: -m/--model (chat and serve also take it as their argument).
MODEL_HELP = (
    "a pair name from `localspec list` or a GGUF path (default: the embedded SmolLM2-135M-Instruct, pair smollm2-135m)"
)


def draft_tokens_arg(value: str) -> DraftTokens:
    try:
        return parse_draft_tokens(value)
    except InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def tree_arg(value: str) -> Trees:
    try:
        return parse_trees(value)
    except InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(f"{exc.message} ({exc.hint})") from None


def ctx_arg(value: str) -> int:
    try:
        return check_ctx(int(value))
    except (ValueError, InvalidRequestError):
        raise argparse.ArgumentTypeError(f"expected a context length of 1 or more tokens, got {value!r}") from None


def gpu_layers_arg(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"--gpu-layers takes a whole number of layers (0 or more), got {value!r}")
    return n


def threads_arg(value: str) -> int | None:
    try:
        return check_threads(int(value))
    except (ValueError, InvalidRequestError):
        raise argparse.ArgumentTypeError(
            f"expected a thread count of 1 or more (0: all physical cores), got {value!r}"
        ) from None


def seed_arg(value: str) -> int | None:
    try:
        seed: int | None = check_knob("seed", int(value))
        return seed
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number (-1: random), got {value!r}") from None


def add_model_options(p: argparse.ArgumentParser, model_option: bool = True) -> None:
    """The pair and how it runs; model_option=False where the model is a positional argument."""
    if model_option:
        p.add_argument("--model", "-m", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("--draft-model", help="drafter GGUF with the target's tokenizer (strategy 'draft')")
    p.add_argument("--backend", default="llamacpp", choices=BACKENDS)
    p.add_argument(
        "--draft-tokens",
        type=draft_tokens_arg,
        default="auto",
        metavar="N|auto",
        help="draft length: 'auto' adapts it to this machine and the text (default)",
    )
    p.add_argument(
        "--tree",
        type=tree_arg,
        default="auto",
        metavar="auto|off|P[,A]",
        help="what a step verifies beside its chain: auto, a tree where this machine's cost curve says it pays "
        "(default); off, chains only; P[,A], a tree at every step with the drafters' runner-ups at the first P "
        "draft positions, A each where a drafter offers several (experiments; output is the same)",
    )
    p.add_argument("--ctx", type=ctx_arg, default=4096, help="context length in tokens (default 4096)")
    p.add_argument(
        "--threads", type=threads_arg, help="CPU threads (default or 0: the physical cores other programs leave free)"
    )
    p.add_argument("--rpc", metavar="HOST:PORT[,HOST:PORT...]", help=RPC_HELP)
    p.add_argument(
        "--gpu-layers",
        type=gpu_layers_arg,
        metavar="N",
        help="llama.cpp: layers on the GPU of a Metal/CUDA/Vulkan build (default: all that fit; 0: CPU only)",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="llama.cpp on the CPU: kernels that give a block the same logits as one-token passes, so greedy "
        "output is plain decoding's bit for bit at any length (slower on K-quants; needs a build without "
        "llamafile, docs/usage.md)",
    )
    p.add_argument(
        "--mmproj", metavar="FILE", help="llama.cpp: the model's projector GGUF, so that its chats may hold images"
    )


def add_model_argument(p: argparse.ArgumentParser) -> None:
    """MODEL as the command's argument, for the commands that are about one model (chat, serve)."""
    p.add_argument("model_arg", nargs="?", metavar="MODEL", help=f"{MODEL_HELP}; the same as --model")


def model_given(args: argparse.Namespace) -> str | None:
    """The MODEL named as the argument or with --model (naming it both ways is refused)."""
    arg: str | None = getattr(args, "model_arg", None)
    option: str | None = args.model
    if arg and option and arg != option:
        raise InvalidRequestError(f"the model is named twice ({arg} and --model {option})", "name it once")
    return arg or option


def model_files(args: argparse.Namespace) -> tuple[str, str | None]:
    """The target file and drafter file MODEL names: a pair's pulled files (its drafter unless
    --draft-model names one), a GGUF path itself, or the embedded default (fetched on first use)."""
    model, draft_model = model_given(args), getattr(args, "draft_model", None)
    if model is None:
        from localspec.models.default_model import ensure_pypi_model

        return str(ensure_pypi_model()), draft_model
    from localspec.api import pair_id

    if pair_id(model, None, args.backend) is None:
        return model, draft_model
    from localspec.models.pull import resolve_pair

    pair = resolve_pair(model, backend=args.backend)
    drafter = str(pair.drafter) if pair.drafter is not None else None
    return str(pair.target), draft_model or drafter


def load_options(args: argparse.Namespace) -> LoadOptions:
    """What add_model_options declares, with the command's --strategy and --memory where it has them."""
    return LoadOptions(
        model=model_given(args),
        draft_model=args.draft_model,
        backend=args.backend,
        # bench's --strategy is a list of contenders, not what a runtime is loaded with.
        strategy=args.strategy if isinstance(getattr(args, "strategy", None), str) else "auto",
        draft_tokens=args.draft_tokens,
        n_ctx=args.ctx,
        threads=args.threads,
        rpc=args.rpc or None,
        memory=getattr(args, "memory", True),
        gpu_layers=args.gpu_layers,
        exact=getattr(args, "exact", False),
        trees=args.tree,
        mmproj=getattr(args, "mmproj", None),
    )


def add_sampling_options(p: argparse.ArgumentParser, max_tokens: int = 512) -> None:
    """SamplingConfig's knobs and defaults; their ranges are checked by SamplingConfig."""
    t = DEFAULTS.temperature
    p.add_argument("--temperature", "-t", type=float, default=t, help=f"0 = greedy (default {t})")
    p.add_argument("--top-k", type=int, default=DEFAULTS.top_k, help=f"0 = off (default {DEFAULTS.top_k})")
    p.add_argument("--top-p", type=float, default=DEFAULTS.top_p, help=f"1 = off (default {DEFAULTS.top_p})")
    p.add_argument("--min-p", type=float, default=DEFAULTS.min_p, help=f"0 = off (default {DEFAULTS.min_p})")
    p.add_argument("--seed", type=seed_arg, help="sampling seed (default or -1: random)")
    p.add_argument(
        "--max-tokens", "-n", type=int, default=max_tokens, help=f"longest reply in tokens (default {max_tokens})"
    )


def sampling(args: argparse.Namespace) -> SamplingConfig:
    return SamplingConfig(**{name: getattr(args, name) for name in KNOBS})
