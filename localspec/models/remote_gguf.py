"""A GGUF's header read over HTTP with range requests: the tokenizer of a file on the hub,
without its weights.

The header (metadata, then tensor descriptions) sits at the start of the file, but its
length is only known once it is parsed, so the reads grow until the bytes fetched hold a
whole header (localspec.common.gguf_header)."""

from __future__ import annotations

from localspec.common.gguf_header import GGUFHeader
from localspec.core.errors import ModelLoadError
from localspec.core.protocol import VocabIdentity
from localspec.models.entries import HubArtifact
from localspec.models.hub_settings import HubSettings

FIRST_READ = 8 << 20  # a 150k-token vocabulary's whole header, in one read


def remote_vocab_identity(
    artifact: HubArtifact, commit: str, name: str, size: int, settings: HubSettings
) -> VocabIdentity:
    """The tokenizer of the GGUF `name` (size bytes) in artifact's repo at commit."""
    from localspec.common.gguf_header import vocab_identity

    return vocab_identity(remote_header(artifact, commit, name, size, settings).meta, f"{artifact.repo}/{name}")


def remote_header(artifact: HubArtifact, commit: str, name: str, size: int, settings: HubSettings) -> GGUFHeader:
    """The GGUF header of `name` (size bytes) in artifact's repo at commit, by range reads."""
    from huggingface_hub import hf_hub_url

    from localspec.common.gguf_header import header_from_bytes

    url = hf_hub_url(artifact.repo, name, revision=commit, endpoint=settings.endpoint)
    where = f"{artifact.repo}/{name}"
    data = b""
    while True:
        chunk = _read_range(url, len(data), max(len(data), FIRST_READ), artifact, name, settings)
        data += chunk
        try:
            header = header_from_bytes(data, where)
        except ValueError as exc:
            raise ModelLoadError(
                f"{where} has no readable GGUF header: {exc}", "the file on the hub is damaged"
            ) from exc
        if header is not None:
            return header
        if len(data) >= size or not chunk:
            raise ModelLoadError(f"{where} ends inside its GGUF header", "the file on the hub is damaged")


def _read_range(url: str, start: int, length: int, artifact: HubArtifact, name: str, settings: HubSettings) -> bytes:
    """Bytes start..start+length of url; a server that ignores the range is read no further."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status  # type: ignore[attr-defined]

    from localspec.models.hub_errors import hub_errors

    headers = build_hf_headers(token=settings.token)
    headers["Range"] = f"bytes={start}-{start + length - 1}"
    stream = get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=settings.timeout)
    with hub_errors(artifact, name, settings), stream as response:
        hf_raise_for_status(response)
        skip = start if response.status_code == 200 else 0  # the whole file from byte 0
        data = bytearray()
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) >= skip + length:
                break
        return bytes(data[skip : skip + length])
