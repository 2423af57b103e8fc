"""`localspec bench`: plain decoding against each strategy, side by side, as ratios."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

from localspec.api import derive_drafter, head_kind, load_drafter
from localspec.backends.llamacpp.rpc_server import split_options
from localspec.cli.options import load_options, model_files
from localspec.common.progress import Steps, reporting
from localspec.common.templates import render_chat
from localspec.control import contention
from localspec.control.prompts import SUITE, BenchPrompt, load_prompts
from localspec.core.backend_loader import load_backend
from localspec.core.choices import FEATURE_DRAFTERS
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend, DerivesFiles
from localspec.models.naming import canonical_name
from localspec.strategies import TABLE, named
from localspec.tooling.bench import (
    MAX_REPEAT_FACTOR,
    BenchPlan,
    BenchRow,
    Contender,
    VsLlamaBench,
    bench,
    format_summary,
    format_table,
    machine,
    rows_to_json,
)
from localspec.tooling.peers import (
    LLAMA_BENCH,
    PROGRAMS,
    PeerRun,
    find_or_build,
    run_llama_bench,
    run_peer,
    same_answer,
)


def register(sub: Any) -> None:
    from localspec.cli.options import add_model_options

    p = sub.add_parser(
        "bench",
        help="measure speedup against plain decoding",
        description="Run plain decoding and each strategy on a prompt suite, side by side.",
    )
    p.add_argument(
        "--strategy",
        "-s",
        action="append",
        help="strategy to compare with plain decoding: ngram, draft, eagle3, qspec[:TYPE], layerskip[:L] "
        "(repeatable; default: ngram, plus draft when --draft-model is given); qspec:all and "
        "layerskip:all measure every candidate the automatic choice considers",
    )
    p.add_argument("--prompts", help='JSONL file: one {"id", "prompt" or "messages"} per line')
    p.add_argument("--only", action="append", help="run only the prompt with this id (repeatable)")
    p.add_argument("--max-tokens", "-n", type=int, default=160)
    p.add_argument("--temperature", "-t", type=float, default=0.0)
    p.add_argument("--repeats", "-r", type=int, default=1)
    p.add_argument(
        "--min-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="repeat each prompt beyond --repeats until plain decoding has run S seconds on it "
        f"(at most {MAX_REPEAT_FACTOR} times --repeats): short answers get as much measured time as long ones",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--plot", metavar="FILE", help="write a PNG: speedup per prompt, acceptance by draft position")
    p.add_argument(
        "--peers",
        action="store_true",
        help="also run llama.cpp's llama-lookup (ngram) and llama-speculative-simple (draft) greedily "
        "on the same models, prompts and token counts, and llama-bench over plain decoding's positions, "
        "each prompt's right after localspec's runs of it; their rates count their answers' tokens, as "
        "localspec's do",
    )
    p.add_argument("--peers-bin", help="folder holding llama.cpp's programs (default: localspec's own build)")
    p.add_argument("--build-peers", action="store_true", help="build llama.cpp's programs if missing (~10 min)")
    p.add_argument(
        "--peer-draft-tokens",
        type=int,
        action="append",
        help="a fixed draft length for the peers (repeatable; default: 4 and 8)",
    )
    add_model_options(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    prompts, model, strategies = _checked(args)
    options = load_options(args).backend_options()
    programs = (*PROGRAMS, LLAMA_BENCH)
    bin_dir = find_or_build(args.peers_bin, build=args.build_peers, programs=programs) if args.peers else None
    samples = [contention.sample()]
    with Steps("localspec bench") as progress:
        progress.step(f"loading {canonical_name(model)}")
        target = load_backend(args.backend, model, **options, **split_options(args.backend, args.rpc))
        if args.threads is None and "threads" in target.capabilities.extra:
            # The drafters and the peers run as many threads as the target chose (contention.py).
            args.threads = options["threads"] = int(target.capabilities.extra["threads"])
        progress.step("preparing the drafters")
        with reporting(progress.detail):
            contenders = [c for s in strategies for c in contenders_for(s, target, args, options)]

        # The peers' runs of a prompt (run_peers), llama-bench's among them, are steps of the
        # count too, between its rows'.
        peered = sum(1 for c in contenders if c.label in TABLE and TABLE[c.label].peer) if args.peers else 0
        peer_steps = len(prompts) * (peered * len(args.peer_draft_tokens or [4, 8]) + 1) if args.peers else 0
        progress.done = 0

        def on_run(done: int, total: int, what: str) -> None:
            progress.total = total + peer_steps
            progress.step(what)
            if done % 8 == 1:  # now and then, whether something else crowds the cores
                samples.append(contention.sample(0.1))

        plan = BenchPlan(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            repeats=args.repeats,
            draft_tokens=args.draft_tokens,
            seed=args.seed,
            min_seconds=args.min_seconds,
            trees=args.tree,
        )
        peers = peer_plan(bin_dir, model, target, prompts) if bin_dir is not None else None
        after = partial(run_peers, args, peers, progress) if peers is not None else None
        rows = bench(target, contenders, prompts, plan, on_run, after)
    samples.append(contention.sample())
    busiest = contention.busiest(samples)
    busy = busiest.describe() if busiest is not None else None
    vs_llama_bench = llama_bench_figures(args, peers, rows) if peers is not None else None
    # The figures first: a plot that cannot be written must not take them with it.
    _report(args, model, rows, vs_llama_bench, busy)
    if args.plot:
        from localspec.tooling.plot import write_plot

        sys.stdout.flush()
        write_plot(rows, args.plot)
    return 0


def _checked(args: argparse.Namespace) -> tuple[list[BenchPrompt], str, list[str]]:
    """The prompts, the model and the strategies to run, each refused before anything loads."""
    prompts = load_prompts(args.prompts) if args.prompts else list(SUITE)
    if args.only:
        prompts = [p for p in prompts if p.id in args.only]
        if not prompts:
            raise InvalidRequestError(f"no prompt has the id {args.only}")
    if args.plot:
        from localspec.tooling.plot import check_plot_target

        check_plot_target(args.plot)
    if args.peers and args.temperature != 0:
        raise InvalidRequestError("the peer comparison runs greedy", "use --temperature 0 with --peers")
    if args.peers and args.rpc:
        raise InvalidRequestError(
            "--peers runs llama.cpp's programs on this machine only, so it cannot compare a split target",
            "drop --peers or --rpc",
        )
    model, args.draft_model = model_files(args)
    strategies = args.strategy or (["ngram", "draft"] if args.draft_model else ["ngram"])
    needs_file = next((s for s in strategies if named(s)[0].source == "file"), None)
    if needs_file is not None and not args.draft_model:
        raise InvalidRequestError(f"strategy {needs_file!r} needs a draft model", "add --draft-model PATH")
    return prompts, model, strategies


def _report(
    args: argparse.Namespace, model: str, rows: list[BenchRow], vs_llama_bench: VsLlamaBench | None, busy: str | None
) -> None:
    """The table and summary, or the same as JSON with the machine and the run's settings."""
    config = {
        "model": model,
        "draft_model": args.draft_model,
        "backend": args.backend,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "repeats": args.repeats,
        "min_seconds": args.min_seconds,
        "draft_tokens": args.draft_tokens,
    }
    if args.json:
        report: dict[str, Any] = {"machine": machine(), "config": config, "results": rows_to_json(rows)}
        if vs_llama_bench is not None:
            report["plain_vs_llama_bench"] = dataclasses.asdict(vs_llama_bench)
        report["summary"] = format_summary(rows, vs_llama_bench, busy).splitlines()
        report["busy"] = busy
        print(json.dumps(report, indent=1))
    else:
        print(f"# {machine()['cpu']}, {machine()['physical_cores']} cores | {config}", file=sys.stderr)
        print(format_table(rows))
        print(format_summary(rows, vs_llama_bench, busy))


def contenders_for(
    strategy: str, target: Backend, args: argparse.Namespace, options: dict[str, Any]
) -> list[Contender]:
    kind, _, option = strategy.partition(":")
    if option != "all":
        return [contender(strategy, target, args, options)]
    if kind not in TABLE or TABLE[kind].source != "derived":
        raise InvalidRequestError(f"only qspec and layerskip can sweep their candidates, not {kind!r}")
    if not isinstance(target, DerivesFiles):  # the GGUF drafters llama.cpp derives
        raise InvalidRequestError(
            f"{strategy} sweeps the GGUF drafters derived with llama.cpp; on {args.backend} name them one by one",
            f"e.g. -s {kind}:TYPE -s {kind}:TYPE",
        )
    return [
        Contender(f"{kind}:{label}", "draft", open_draft=partial(load_backend, args.backend, str(path), **options))
        for label, path in target.derived_drafters(kind)
    ]


def contender(strategy: str, target: Backend, args: argparse.Namespace, options: dict[str, Any]) -> Contender:
    """The column of a strategy, its drafter by the strategy table's row: none, lookup, a file
    (a head in the target's memory, else a model opened for its runs) or derived from the target."""
    row, option = named(strategy)
    if row.source in ("none", "lookup"):
        return Contender(strategy, strategy)
    if row.source not in ("file", "derived"):
        choose = "choose from: ngram, draft, eagle3, qspec[:TYPE], layerskip[:L], mtp"
        raise InvalidRequestError(f"bench does not run strategy {strategy!r}", choose)
    kind = head_kind(args.draft_model) if args.draft_model and row.source == "file" else None
    if kind is not None:  # a head that reads the target's layers: it lives in the target's memory
        return Contender(kind, "draft", load_drafter(target, args.draft_model, args.backend, options))
    if row.name in FEATURE_DRAFTERS:  # its head's GGUF was not given
        raise InvalidRequestError(f"strategy {strategy!r} needs its head's GGUF", "add --draft-model PATH")
    if row.source == "file":
        opened = partial(load_backend, args.backend, args.draft_model, **options)
        return Contender(row.label, row.name, open_draft=opened)
    draft = derive_drafter(target, row.name, option)
    label = draft.capabilities.self_draft or strategy
    if draft.info.path == target.info.path:  # it lives in the target's memory
        return Contender(label, "draft", draft)
    draft.close()  # a file of its own: opened for its runs only (see Contender)
    return Contender(label, "draft", open_draft=partial(load_backend, args.backend, draft.info.path, **options))


@dataclasses.dataclass(frozen=True)
class PeerPlan:
    """What llama.cpp's programs run beside the rows: their folder, the model, and each
    prompt's chat text as the target's template renders it, and its length in tokens."""

    bin_dir: Path
    model: str
    texts: dict[str, str]
    lengths: dict[str, int]


def peer_plan(bin_dir: Path, model: str, target: Backend, prompts: list[BenchPrompt]) -> PeerPlan:
    template, special, source = target.chat_template(), target.special_texts(), target.info.path
    texts = {p.id: render_chat(template, p.messages, special, source=source) for p in prompts}
    lengths = {p: len(target.tokenize(t, add_special=True, parse_special=True)) for p, t in texts.items()}
    return PeerPlan(bin_dir, model, texts, lengths)


def like_run(row: BenchRow, length: int) -> tuple[int, int]:
    """llama-bench's -d and -n for a prompt's plain decoding: the position of its first answer
    token's pass, and its runs' mean passes (plain decoding runs twice a repeat)."""
    return length - 1, round(row.plain_passes / (2 * row.repeats))


def run_peers(args: argparse.Namespace, peers: PeerPlan, progress: Steps, rows: list[BenchRow]) -> None:
    """The peers beside one prompt's rows, right after them (bench's after_prompt)."""
    for row in rows:
        program = TABLE[row.strategy].peer if row.strategy in TABLE else None
        if program is None:
            continue
        draft = args.draft_model if TABLE[row.strategy].source == "file" else None
        for gamma in args.peer_draft_tokens or [4, 8]:
            label = f"{program} (γ={gamma})"
            progress.step(f"prompt {row.prompt!r}, {label}")
            run = PeerRun(program, peers.model, peers.texts[row.prompt], args.max_tokens, gamma, draft, args.threads)
            results = [run_peer(peers.bin_dir, run) for _ in range(row.repeats or args.repeats)]
            tokens = sum(r.tokens for r in results)
            row.add_peer(label, tokens / sum(r.seconds for r in results), tokens)
            if row.answer and any(r.text is not None and not same_answer(row.answer, r.text) for r in results):
                row.other_answers.append(label)
    last = rows[-1] if rows else None
    if last is not None and last.repeats:  # plain decoding like for like, beside its rows too
        depth, passes = like_run(last, peers.lengths[last.prompt])
        progress.step(f"prompt {last.prompt!r}, {LLAMA_BENCH}")
        rate = run_llama_bench(peers.bin_dir, peers.model, passes, args.threads, depth) if passes else None
        for row in rows:
            row.llama_bench_like = rate


def llama_bench_figures(args: argparse.Namespace, peers: PeerPlan, rows: list[BenchRow]) -> VsLlamaBench | None:
    """Plain decoding against llama-bench where the peers' folder has it: from an empty
    context and at the prompts' mean length, run now; like for like, as run_peers ran it
    beside each prompt's rows."""
    bin_dir, model, lengths = peers.bin_dir, peers.model, peers.lengths
    theirs = run_llama_bench(bin_dir, model, 128, args.threads)
    if theirs is None or not rows:
        return None
    plain = list(dict((r.prompt, r) for r in rows).values())
    ours = statistics.fmean(r.plain_tokens_per_s for r in plain)
    depth = round(statistics.fmean(lengths.values()))
    at_depth = run_llama_bench(bin_dir, model, 128, args.threads, depth)
    # Like for like, prompt by prompt: the same passes over the same positions (a pass's cost
    # steps up where the cache's cells in use pass a multiple of 256, so one mean depth is not).
    like_runs = [like_run(r, lengths[r.prompt]) for r in plain if r.repeats]
    theirs_like = [r.llama_bench_like for r in plain if r.llama_bench_like]
    like = statistics.fmean(theirs_like) if theirs_like else None
    ours_passes = statistics.fmean(r.plain_passes_per_s for r in plain)
    like_depth = round(statistics.fmean(d for d, _ in like_runs)) if like_runs else 0
    passes = round(statistics.fmean(n for _, n in like_runs)) if like_runs else 0
    return VsLlamaBench(ours, theirs, at_depth, depth, ours_passes, like, like_depth, passes)
