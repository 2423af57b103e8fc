"""Self-drafting without a second download: the drafter is derived from the target.

- qspec[:TYPE]: the target requantized to a low-bit type (QSpec-style). On llama.cpp that is
  a GGUF made once with llama.cpp's own quantize call.
- layerskip[:L]: the target with some transformer blocks left out (early exit after block L,
  or a set of middle blocks skipped, as in training-free layer skipping), reusing the
  target's final norm and output head. On llama.cpp that is a GGUF made with quantize's
  prune list: it costs the kept blocks' weights once more in memory and its own KV cache;
  llama.cpp has no API to stop a forward pass early or share KV across contexts.

Without an explicit TYPE or L, candidates are derived and the one with the best predicted
tokens/s on this machine wins: top-1 agreement with the target on a calibration text
(acceptance) against the drafter's measured step cost, through the same formula the
adaptive controller uses. The choice is cached per target and machine.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localspec.calibrate import (
    CALIBRATION_TEXT,
    agreement,
    backend_key,
    calibrated,
    drafting_seconds,
    remember,
    remembered,
)
from localspec.controller import AdaptiveDraftLength
from localspec.errors import InvalidRequestError
from localspec.paths import data_dir
from localspec.prompts import CODE, PASSAGE
from localspec.protocol import Backend
from localspec.quantize import FTYPES, derived

KINDS = ("qspec", "layerskip")
QSPEC_TYPES = ("Q4_0", "Q3_K_M", "Q2_K")
# `bench -s qspec:all` also measures the near-lossless types, to show where acceptance stops
# paying for their cost.
QSPEC_SWEEP = ("Q8_0", "Q4_K_M", *QSPEC_TYPES)
# llama.cpp general.file_type -> the type name quantize takes, for keeping a target's type.
FILE_TYPES = {v: k for k, v in FTYPES.items()} | {0: "F16"}


@dataclass(frozen=True)
class Candidate:
    label: str  # what the user would type after the colon
    ftype: str
    prune: tuple[int, ...] = ()


def parse(strategy: str) -> tuple[str, str | None] | None:
    """("qspec", "Q2_K") for "qspec:Q2_K"; None for strategies that are not self-drafting."""
    kind, _, option = strategy.partition(":")
    if kind not in KINDS:
        return None
    return kind, option or None


def file_fingerprint(path: str) -> str:
    """sha256 of the file, computed once per (path, size, mtime) and remembered."""
    stat = os.stat(path)
    key = f"{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}"
    store = data_dir() / "hashes.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                digest.update(block)
        known[key] = digest.hexdigest()
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(json.dumps(known, indent=1))
    return str(known[key])


def candidates(kind: str, option: str | None, n_layers: int, target_ftype: str) -> list[Candidate]:
    if kind == "qspec":
        if option is None:
            return [Candidate(t, t) for t in QSPEC_TYPES]
        if option not in FTYPES:
            raise InvalidRequestError(
                f"unknown low-bit type {option!r} for qspec", f"choose one of: {', '.join(FTYPES)}"
            )
        return [Candidate(option, option)]
    if option is not None:
        try:
            keep = int(option)
        except ValueError:
            raise InvalidRequestError(f"layerskip takes the number of blocks to keep, got {option!r}") from None
        if not 1 <= keep < n_layers:
            raise InvalidRequestError(f"layerskip:{keep} must keep between 1 and {n_layers - 1} of {n_layers} blocks")
        return [Candidate(option, target_ftype, tuple(range(keep, n_layers)))]
    out = [Candidate(str(k), target_ftype, tuple(range(k, n_layers))) for k in (n_layers // 2, (3 * n_layers) // 4)]
    # Training-free layer skipping: drop every other block in the middle half.
    middle = tuple(range(n_layers // 4 + 1, (3 * n_layers) // 4, 2))
    out.append(Candidate(f"skip-middle-{len(middle)}", target_ftype, middle))
    return out


def exit_candidates(n_layers: int) -> list[str]:
    """Early exits worth measuring for an in-memory layer-skip drafter: from half the blocks
    (cheap, agrees less) to five sixths (agrees more, costs more)."""
    keep = {min(n_layers - 1, max(1, round(n_layers * f))) for f in (1 / 2, 2 / 3, 3 / 4, 5 / 6)}
    return [str(k) for k in sorted(keep)]


def best_in_memory(target: Backend, kind: str, labels: list[str], make: Callable[[str], Backend]) -> Backend:
    """The in-memory self-drafter (made by make(label)) with the best predicted tokens/s on
    this machine, by the same measure as self_draft_path; the choice is remembered per
    target and machine, so later loads make only the winner."""
    key = f"self-draft|{kind}|{backend_key(target)}"
    hit = remembered(key)
    if len(labels) == 1 or (hit is not None and hit.get("label") in labels):
        return make(labels[0] if len(labels) == 1 else str(hit["label"]))  # type: ignore[index]
    text = target.tokenize(CALIBRATION_TEXT + "\n" + CODE + "\n" + PASSAGE, add_special=True, parse_special=False)
    text = text[: target.info.n_ctx]
    scored = []
    for label in labels:
        draft = make(label)
        scored.append((predicted_rate(target, draft, agreement(target, draft, text)), label))
        draft.close()
    _, best = max(scored)
    remember(key, {"label": best})
    return make(best)


def predicted_rate(target: Backend, draft: Backend, alpha: float) -> float:
    policy = AdaptiveDraftLength(calibrated(target).cost_curve(), drafting_seconds(draft), prior=alpha)
    return policy.rate(policy.choose(policy.max_gamma))


def _derived_home(target: Backend) -> tuple[Path, str]:
    """Where drafters derived from target live, and the target's own quantization type."""
    folder = data_dir() / "derived" / file_fingerprint(target.info.path)[:16]
    return folder, FILE_TYPES.get(int(target.capabilities.extra.get("file_type", "1")), "F16")


def sweep(target: Backend, kind: str) -> list[tuple[str, Path]]:
    """Every candidate drafter of a kind, derived (once) for a side-by-side measurement."""
    folder, ftype = _derived_home(target)
    if kind == "qspec":
        options = [Candidate(t, t) for t in QSPEC_SWEEP if t != ftype]
    else:
        options = candidates(kind, None, target.info.n_layers, ftype)
    return [(c.label, derived(target.info.path, c.ftype, folder, c.prune)) for c in options]


def self_draft_path(
    target: Backend,
    kind: str,
    option: str | None,
    load: Callable[[str], Backend],
) -> tuple[Path, str]:
    """The derived drafter's GGUF for target and the chosen label (e.g. "Q4_0", "20")."""
    folder, ftype = _derived_home(target)
    options = candidates(kind, option, target.info.n_layers, ftype)
    choice_file = folder / "choice.json"
    try:
        remembered = json.loads(choice_file.read_text()).get(kind)
    except (OSError, ValueError, AttributeError):
        remembered = None
    if len(options) > 1 and remembered in [c.label for c in options]:
        options = [c for c in options if c.label == remembered]
    if len(options) == 1:
        c = options[0]
        return derived(target.info.path, c.ftype, folder, c.prune), c.label
    text = target.tokenize(CALIBRATION_TEXT + "\n" + CODE + "\n" + PASSAGE, add_special=True, parse_special=False)
    scored = []
    for c in options:
        path = derived(target.info.path, c.ftype, folder, c.prune)
        draft = load(str(path))
        try:
            scored.append((predicted_rate(target, draft, agreement(target, draft, text)), c.label, path))
        finally:
            draft.close()
    _, label, path = max(scored)
    try:
        data = json.loads(choice_file.read_text()) if choice_file.exists() else {}
    except (OSError, ValueError):
        data = {}
    data[kind] = label
    choice_file.write_text(json.dumps(data))
    return path, label
