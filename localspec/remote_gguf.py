"""A GGUF's header read over HTTP with range requests: the tokenizer of a file on the hub,
without its weights.

The header (metadata, then tensor descriptions) sits at the start of the file, but its
length is only known once it is parsed, so the reads grow until the gguf reader parses a
header that ends inside the bytes fetched. The bytes go into a sparse file of the real size,
so the reader (which maps the whole file) sees every tensor where the header says it is."""

from __future__ import annotations

import tempfile
from pathlib import Path

from localspec.errors import ModelLoadError
from localspec.hub import HubSettings
from localspec.protocol import VocabIdentity
from localspec.registry import HubArtifact

FIRST_READ = 8 << 20  # a 150k-token vocabulary's whole header, in one read


def remote_vocab_identity(
    artifact: HubArtifact, commit: str, name: str, size: int, settings: HubSettings
) -> VocabIdentity:
    """The tokenizer of the GGUF `name` (size bytes) in artifact's repo at commit."""
    import gguf
    from huggingface_hub import hf_hub_url

    from localspec.pairing import reader_vocab_identity

    url = hf_hub_url(artifact.repo, name, revision=commit, endpoint=settings.endpoint)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(b"")
        have = 0
        while True:
            with path.open("r+b") as fh:
                fh.seek(have)
                have += fh.write(_read_range(url, have, max(have, FIRST_READ), artifact, name, settings))
                fh.truncate(size)  # sparse: no disk for the weights that were not fetched
            try:
                reader = gguf.GGUFReader(path)
                if reader.data_offset <= have:  # the header parsed from real bytes only
                    return reader_vocab_identity(reader, f"{artifact.repo}/{name}")
            except Exception as exc:  # a header cut short reads as garbage: fetch more
                if have >= size:
                    raise ModelLoadError(
                        f"{artifact.repo}/{name} has no readable GGUF header: {exc}", "the file on the hub is damaged"
                    ) from exc


def _read_range(url: str, start: int, length: int, artifact: HubArtifact, name: str, settings: HubSettings) -> bytes:
    """Bytes start..start+length of url; a server that ignores the range is read no further."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status  # type: ignore[attr-defined]

    from localspec.hub import hub_errors

    headers = build_hf_headers(token=settings.token)
    headers["Range"] = f"bytes={start}-{start + length - 1}"
    stream = get_session().stream("GET", url, headers=headers, follow_redirects=True)
    with hub_errors(artifact, name, settings), stream as response:
        hf_raise_for_status(response)
        skip = start if response.status_code == 200 else 0  # the whole file from byte 0
        data = bytearray()
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) >= skip + length:
                break
        return bytes(data[skip : skip + length])
