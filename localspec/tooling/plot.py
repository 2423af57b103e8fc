"""The bench's picture: speedup per prompt and strategy, and acceptance by draft position."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from localspec.core.errors import BackendUnavailableError, InvalidRequestError
from localspec.tooling.bench import BenchRow


def check_plot_target(path: str | Path) -> Path:
    """Fail before a bench run, not after it, when the picture could not be written: the
    run takes minutes and its figures are what the user came for."""
    out = Path(path)
    _matplotlib()
    if out.is_dir():
        raise InvalidRequestError(f"--plot {out} is a folder", "give a file name, e.g. --plot bench.png")
    folder = out.parent
    if not folder.is_dir():
        raise InvalidRequestError(f"--plot {out}: the folder {folder} does not exist", f"mkdir -p {folder}")
    if not os.access(folder, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise InvalidRequestError(f"--plot {out}: no permission to write there", "pick a folder you can write to")
    return out


def _matplotlib() -> ModuleType:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise BackendUnavailableError("--plot needs matplotlib", "pip install 'localspec[plot]'") from exc
    return plt


def write_plot(rows: Sequence[BenchRow], path: str | Path) -> Path:
    plt = _matplotlib()
    prompts = list(dict.fromkeys(r.prompt for r in rows))
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(len(strategies), 1)
    for i, strategy in enumerate(strategies):
        speed = {r.prompt: r.speedup for r in rows if r.strategy == strategy}
        xs = [p + i * width for p in range(len(prompts))]
        left.bar(xs, [speed.get(p, 0.0) for p in prompts], width, label=strategy)
        accept: dict[int, list[float]] = {}
        for r in rows:
            if r.strategy == strategy:
                for pos, a in enumerate(r.acceptance_by_position):
                    accept.setdefault(pos, []).append(a)
        if accept:
            positions = sorted(accept)
            right.plot(
                [p + 1 for p in positions], [sum(accept[p]) / len(accept[p]) for p in positions], "o-", label=strategy
            )
    left.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    left.set_xticks([p + width * (len(strategies) - 1) / 2 for p in range(len(prompts))], prompts)
    left.set_ylabel("speedup vs plain decoding")
    left.legend()
    right.set_xlabel("draft position")
    right.set_ylabel("acceptance rate")
    right.set_ylim(0, 1.05)
    if right.get_lines():
        right.legend()
    fig.tight_layout()
    out = Path(path)
    try:
        fig.savefig(out, dpi=110)
    except OSError as exc:
        raise InvalidRequestError(
            f"could not write the plot to {out}: {exc.strerror or exc}",
            "the figures were printed above; run again with another --plot path",
        ) from exc
    finally:
        plt.close(fig)
    return out
