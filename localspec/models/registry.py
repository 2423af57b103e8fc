"""models.toml: target + drafter pairs and where each model's files come from, parsed into
typed entries (entries.py) and validated strictly (an unknown key, a missing field or a bad value names
the file, the entry and the key). A user file in the data directory is merged over the
packaged one: an entry with the same id replaces the packaged entry whole.

The canonical file is `models.toml` at the top of the repository (the design card's layout);
the wheel ships the identical copy `localspec/models.toml` (setuptools cannot ship a file
from outside a package without deprecated data-files), and a test keeps the two identical."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from localspec.core.backend_loader import kind_of
from localspec.core.choices import (
    EVERY_STRATEGY,
    PULLABLE_BACKENDS,
    SELF_DRAFTING_STRATEGY,
    DraftTokens,
)
from localspec.core.errors import LocalspecError
from localspec.models.default_model import PyPIModel
from localspec.models.entries import (
    Artifact,
    HubArtifact,
    HubFile,
    LocalArtifact,
    Model,
    Pair,
    PyPIArtifact,
    split_shards,
)
from localspec.store import data_dir, warn_if_others_can_write
from localspec.strategies import TABLE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# What reaches a program's argument list or a path is checked first: a value that could be
# read as an option (pip's --log=FILE) or that climbs out of a folder (../) is refused.
_REVISION = re.compile(r"^(?!.*\.\.)[A-Za-z0-9_][\w./-]*(?<![/.])$")
_PACKAGE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_RELATIVE = re.compile(r"^(?![/\\])(?!(?:.*[/\\])?\.\.(?:[/\\]|$))[^\x00]+$")


class RegistryError(LocalspecError):
    """models.toml (packaged or the user's) cannot be used as written."""


class UnknownPairError(LocalspecError):
    """A pair id or alias that no models.toml defines."""


@dataclass(frozen=True)
class Registry:
    models: Mapping[str, Model]
    pairs: Mapping[str, Pair]
    files: tuple[Path, ...]  # the files read, packaged first

    def pair(self, name: str) -> Pair:
        """A pair by id or alias."""
        if name in self.pairs:
            return self.pairs[name]
        for pair in self.pairs.values():
            if name in pair.aliases:
                return pair
        import difflib

        close = difflib.get_close_matches(name, [*self.pairs, *(a for p in self.pairs.values() for a in p.aliases)])
        hint = f"did you mean {close[0]}? " if close else ""
        raise UnknownPairError(
            f"no pair named {name!r} in {' or '.join(str(f) for f in self.files)}",
            f"{hint}`localspec list` shows the pairs; add your own to {user_registry_file()}",
        )


def packaged_registry_file() -> Path:
    return Path(str(resources.files("localspec") / "models.toml"))


def user_registry_file() -> Path:
    return data_dir() / "models.toml"


def load_registry(user_file: Path | None = None) -> Registry:
    """The packaged registry with the user's file (if any) merged over it."""
    files = [packaged_registry_file()]
    user = user_file if user_file is not None else user_registry_file()
    if user.is_file():
        files.append(user)
        warn_if_others_can_write(user, "the registry")
    models: dict[str, Model] = {}
    raw_pairs: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in files:
        doc = _read_toml(path)
        _check_keys(doc, {"models", "pairs"}, path, "the file")
        for model_id, entry in _table(doc, "models", path, "the file").items():
            models[model_id] = _parse_model(model_id, entry, path)
        for pair_id, entry in _table(doc, "pairs", path, "the file").items():
            raw_pairs[pair_id] = (path, entry)
    pairs = {pid: _parse_pair(pid, entry, path, models) for pid, (path, entry) in raw_pairs.items()}
    _check_aliases(pairs)
    return Registry(models, pairs, tuple(files))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        # A BOM is what some Windows editors put first: accepted, as most TOML readers do.
        return tomllib.loads(raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RegistryError(
            f"{path}: not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})", "save the file as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{path}: not valid TOML: {exc}", "fix the file's syntax") from exc
    except RecursionError:  # `a = [[[[...]]]]` thousands deep: the parser recurses per level
        raise RegistryError(
            f"{path}: its arrays or tables nest too deeply to read",
            "fix the file: no entry nests more than a few levels",
        ) from None
    except OSError as exc:
        raise RegistryError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from exc


# -- validation helpers: every message names the file, the entry and the key


def _fail(path: Path, where: str, key: str, problem: str) -> RegistryError:
    return RegistryError(f"{path}: {where}: key {key!r}: {problem}", "fix the entry, or remove it to use the default")


def _check_keys(
    table: Mapping[str, Any],
    allowed: set[str],
    path: Path,
    where: str,
    required: frozenset[str] | set[str] = frozenset(),
) -> None:
    for key in table:
        if key not in allowed:
            raise _fail(path, where, key, f"unknown key (allowed: {', '.join(sorted(allowed))})")
    missing = sorted(set(required) - set(table))
    if missing:
        raise _fail(path, where, missing[0], "missing")


def _table(table: Mapping[str, Any], key: str, path: Path, where: str) -> dict[str, Any]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise _fail(path, where, key, f"expected a table, got {type(value).__name__}")
    return value


def _str(table: Mapping[str, Any], key: str, path: Path, where: str, pattern: re.Pattern[str] | None = None) -> str:
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, where, key, f"expected a non-empty string, got {value!r}")
    if pattern is not None and not pattern.match(value):
        raise _fail(path, where, key, f"{value!r} does not match {pattern.pattern}")
    return value


def _size(value: Any, path: Path, where: str, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _fail(path, where, key, f"expected a size in bytes > 0, got {value!r}")
    return value


def _sha(value: Any, path: Path, where: str, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _SHA256.match(value):
        raise _fail(path, where, key, f"expected 64 lowercase hex digits, got {value!r}")
    return value


# -- models


def _parse_model(model_id: str, entry: Any, path: Path) -> Model:
    where = f"model {model_id!r}"
    if not _ID.match(model_id):
        raise _fail(path, where, "id", f"{model_id!r} does not match {_ID.pattern}")
    if not isinstance(entry, dict):
        raise _fail(path, where, model_id, "expected a table")
    meta = {"name", "family", "license", "params"}
    _check_keys(entry, meta | set(PULLABLE_BACKENDS) | {"safetensors"}, path, where, required=meta)
    artifacts = {
        b: _parse_artifact(entry[b], path, f"{where}, backend {b!r}", b) for b in PULLABLE_BACKENDS if b in entry
    }
    safetensors = (
        _parse_artifact(entry["safetensors"], path, f"{where}, safetensors", "torch")
        if "safetensors" in entry
        else None
    )
    if safetensors is not None and not isinstance(safetensors, HubArtifact):
        raise _fail(path, where, "safetensors", "expected a hub repo {repo, revision, files}: serving engines load it")
    if not artifacts and safetensors is None:
        raise _fail(
            path, where, "llamacpp", f"a model needs files for at least one backend ({', '.join(PULLABLE_BACKENDS)})"
        )
    return Model(
        id=model_id,
        name=_str(entry, "name", path, where),
        family=_str(entry, "family", path, where, _ID),
        license=_str(entry, "license", path, where),
        params=_str(entry, "params", path, where),
        artifacts=artifacts,
        origin=path,
        safetensors=safetensors,
    )


def _parse_artifact(entry: Any, path: Path, where: str, backend: str) -> Artifact:
    if not isinstance(entry, dict):
        raise _fail(path, where, backend, "expected a table")
    if "pypi" in entry:
        _check_keys(entry, {"pypi"}, path, where)
        return _parse_pypi(entry["pypi"], path, where)
    if "path" in entry:
        _check_keys(entry, {"path"}, path, where)
        return _parse_local(entry, path, where, backend)
    _check_keys(entry, {"repo", "revision", "files"}, path, where, required={"repo", "revision", "files"})
    files = entry["files"]
    if not isinstance(files, list) or not files:
        raise _fail(path, where, "files", "expected a non-empty list of file names or {name, size, sha256} tables")
    parsed = tuple(_parse_file(f, path, f"{where}, files[{i}]") for i, f in enumerate(files))
    if kind_of(backend).gguf and any(f.is_pattern or not f.name.endswith(".gguf") for f in parsed):
        raise _fail(path, where, "files", "llama.cpp needs exact .gguf file names (split files in order)")
    if kind_of(backend).gguf:
        parsed = _expand_split(parsed, path, where)
    return HubArtifact(_str(entry, "repo", path, where, _REPO), _str(entry, "revision", path, where, _REVISION), parsed)


def _expand_split(files: tuple[HubFile, ...], path: Path, where: str) -> tuple[HubFile, ...]:
    """A split GGUF given by its first shard alone means every shard; listed shards must be
    the whole set, in order (llama.cpp opens the first and finds the others by name). One
    sidecar drafter (mtp-*.gguf) may follow the model's own file or shards."""
    own = tuple(f for f in files if not f.is_sidecar)
    sidecars = files[len(own) :]
    if not own:
        raise _fail(path, where, "files", f"{files[0].name} is a sidecar drafter: list the model's own GGUF first")
    if any(f.is_sidecar for f in files[: len(own)]) or len(sidecars) > 1:
        raise _fail(
            path, where, "files", "list the model's GGUF (or its shards) first, then at most one sidecar mtp-*.gguf"
        )
    return (*_expand_shards(own, path, where), *sidecars)


def _expand_shards(files: tuple[HubFile, ...], path: Path, where: str) -> tuple[HubFile, ...]:
    shards = split_shards(files[0].name)
    if len(files) == 1 and len(shards) > 1 and shards[0] == files[0].name:
        return (files[0], *(HubFile(name) for name in shards[1:]))
    names = tuple(f.name for f in files)
    for file in files:
        expected = split_shards(file.name)
        if len(expected) > 1 and names != expected:
            raise _fail(
                path,
                where,
                "files",
                f"{file.name} is one shard of {len(expected)}: list {expected[0]} alone, or every shard in order",
            )
    return files


def _parse_local(entry: Mapping[str, Any], path: Path, where: str, backend: str) -> LocalArtifact:
    """`path = ...`: absolute, or relative to the models.toml that names it; ~ is expanded."""
    local = Path(_str(entry, "path", path, where)).expanduser()
    local = local if local.is_absolute() else path.parent / local
    if kind_of(backend).gguf and local.suffix != ".gguf":
        raise _fail(path, where, "path", f"llama.cpp needs a .gguf file (the first shard of a split one), got {local}")
    return LocalArtifact(local)


def _parse_file(entry: Any, path: Path, where: str) -> HubFile:
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, dict):
        raise _fail(path, where, "name", f"expected a file name or a table, got {entry!r}")
    _check_keys(entry, {"name", "size", "sha256"}, path, where, required={"name"})
    file = HubFile(
        _str(entry, "name", path, where, _RELATIVE),
        _size(entry.get("size"), path, where, "size"),
        _sha(entry.get("sha256"), path, where, "sha256"),
    )
    if file.is_pattern and (file.size or file.sha256):
        raise _fail(path, where, "sha256" if file.sha256 else "size", "a glob pattern cannot carry a size or sha256")
    return file


def _parse_pypi(entry: Any, path: Path, where: str) -> PyPIArtifact:
    where = f"{where}, pypi"
    if not isinstance(entry, dict):
        raise _fail(path, where, "pypi", "expected a table {package, version, member, sha256, size}")
    keys = {"package", "version", "member", "sha256"}
    _check_keys(entry, keys | {"size"}, path, where, required=keys)
    sha = _sha(entry["sha256"], path, where, "sha256")
    assert sha is not None  # required above
    source = PyPIModel(
        _str(entry, "package", path, where, _PACKAGE),
        _str(entry, "version", path, where, _VERSION),
        _str(entry, "member", path, where, _RELATIVE),
        sha,
    )
    return PyPIArtifact(source, _size(entry.get("size"), path, where, "size"))


# -- pairs


def _parse_pair(pair_id: str, entry: Any, path: Path, models: Mapping[str, Model]) -> Pair:
    where = f"pair {pair_id!r}"
    if not _ID.match(pair_id):
        raise _fail(path, where, "id", f"{pair_id!r} does not match {_ID.pattern}")
    if not isinstance(entry, dict):
        raise _fail(path, where, pair_id, "expected a table")
    required = {"description", "target", "strategy"}
    optional = {"aliases", "drafter", "draft_tokens", "rpc", "mmproj"}
    _check_keys(entry, required | optional, path, where, required=required)

    def model(key: str) -> Model:
        name = _str(entry, key, path, where)
        if name not in models:
            raise _fail(path, where, key, f"no model {name!r} (known: {', '.join(sorted(models))})")
        return models[name]

    drafter = model("drafter") if "drafter" in entry else None
    strategy = _str(entry, "strategy", path, where)
    row = TABLE.get(strategy.partition(":")[0])
    if row is None or (":" in strategy and not (row.source == "derived" and SELF_DRAFTING_STRATEGY.match(strategy))):
        raise _fail(path, where, "strategy", f"expected one of {EVERY_STRATEGY}, got {strategy!r}")
    if row.drafter_file == "must" and drafter is None:
        raise _fail(path, where, "drafter", f"missing: strategy {strategy!r} needs a drafter model")
    # mtp takes a drafter where the model's MTP head ships as a model of its own (Gemma 4's assistant).
    if row.drafter_file == "never" and drafter is not None:
        raise _fail(path, where, "drafter", f"strategy {strategy!r} does not use a drafter; remove it or use 'draft'")
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and _ID.match(a) for a in aliases):
        raise _fail(path, where, "aliases", f"expected a list of ids matching {_ID.pattern}, got {aliases!r}")
    pair = Pair(
        id=pair_id,
        aliases=tuple(aliases),
        description=_str(entry, "description", path, where),
        target=model("target"),
        drafter=drafter,
        strategy=strategy,
        draft_tokens=_draft_tokens(entry.get("draft_tokens", "auto"), path, where),
        origin=path,
        rpc=_rpc(entry.get("rpc", []), path, where),
        mmproj=_projector(model("mmproj"), path, where) if "mmproj" in entry else None,
    )
    if not pair.backends:
        raise _fail(path, where, "drafter", "target and drafter have no backend in common")
    return pair


def _projector(model: Model, path: Path, where: str) -> Model:
    """A pair's mmproj: a model with a llama.cpp GGUF (mtmd reads projectors on llama.cpp only)."""
    if not any(kind_of(b).gguf for b in model.artifacts):
        raise _fail(path, where, "mmproj", f"model {model.id!r} has no llama.cpp GGUF: a projector is an mmproj GGUF")
    return model


def _draft_tokens(value: Any, path: Path, where: str) -> DraftTokens:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 16:
        raise _fail(path, where, "draft_tokens", f"expected 'auto' or a whole number from 1 to 16, got {value!r}")
    return value


def _rpc(value: Any, path: Path, where: str) -> tuple[str, ...]:
    from localspec.backends.llamacpp.rpc_server import RpcServerError, parse_endpoints

    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, where, "rpc", f'expected "HOST:PORT" or a list of them, got {value!r}')
    try:
        return parse_endpoints(value) if value else ()
    except RpcServerError as exc:
        raise _fail(path, where, "rpc", exc.message) from None


def _check_aliases(pairs: Mapping[str, Pair]) -> None:
    seen: dict[str, str] = {}
    for pair in pairs.values():
        for alias in pair.aliases:
            other = alias if alias in pairs else seen.get(alias)
            if other is not None:
                raise _fail(pair.origin, f"pair {pair.id!r}", "aliases", f"{alias!r} already names pair {other!r}")
            seen[alias] = pair.id
