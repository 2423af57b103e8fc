"""Split GGUFs (NAME-00001-of-0000N.gguf): named by their first shard in models.toml, pulled
in full and checked shard by shard, opened by llama.cpp through the first shard, and
requantized from split input for the self-drafters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localspec.models.entries import split_shards
from localspec.models.hub_errors import ChecksumMismatchError
from localspec.models.pull import pull, resolve_pair
from localspec.models.registry import RegistryError, load_registry, user_registry_file
from localspec.testing.fakehub import TEST_REGISTRY, TOKENS, FakeHub, serve_test_pairs, sha256, split_gguf

SHARDS = [f"split-target-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
SPLIT_MODEL = """
[models.split-target]
name = "Split-Target"
family = "tiny"
license = "mit"
params = "66K"
llamacpp = {{ repo = "test/split-GGUF", revision = "main", files = {files} }}

[pairs.split]
description = "A split target"
target = "split-target"
drafter = "tiny-drafter"
strategy = "draft"
"""


def write_registry(files: str) -> None:
    user_registry_file().parent.mkdir(parents=True, exist_ok=True)
    user_registry_file().write_text(TEST_REGISTRY + SPLIT_MODEL.format(files=files))


@pytest.fixture
def hub(tmp_path: Path, temporary_localspec_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    with FakeHub() as fake:
        serve_test_pairs(fake, temporary_localspec_home)
        fake.add("test/split-GGUF", split_gguf("split-target", TOKENS, 3))
        write_registry(f'["{SHARDS[0]}"]')
        yield fake


def test_split_shards_names_every_shard_from_any_one() -> None:
    assert split_shards(SHARDS[1]) == tuple(SHARDS)
    assert split_shards("model.gguf") == ("model.gguf",)


def test_the_first_shard_alone_means_every_shard() -> None:
    write_registry(f'["{SHARDS[0]}"]')
    artifact = load_registry().models["split-target"].artifacts["llamacpp"]
    assert [f.name for f in artifact.files] == SHARDS  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "files", [f'["{SHARDS[1]}"]', f'["{SHARDS[0]}", "{SHARDS[2]}"]', f'["{SHARDS[1]}", "{SHARDS[0]}"]']
)
def test_an_incomplete_or_unordered_set_of_shards_is_refused(files: str) -> None:
    write_registry(files)
    with pytest.raises(RegistryError, match=r"is one shard of 3: list split-target-00001-of-00003.gguf alone"):
        load_registry()


def test_a_split_pair_is_pulled_in_full_and_opened_by_its_first_shard(hub: FakeHub) -> None:
    result = pull("split", endpoint=hub.endpoint, progress=False)
    assert [f.name for f in result.files if f.role == "target"] == SHARDS
    assert sorted(n for n in hub.resolve_gets() if n.startswith("split")) == SHARDS
    target = resolve_pair("split").target
    assert target.name == SHARDS[0]
    for name in SHARDS:  # side by side, where llama.cpp looks for the other shards
        assert (target.parent / name).read_bytes() == hub.repos["test/split-GGUF"].files[name]


def test_each_shard_is_checked_on_its_own(hub: FakeHub) -> None:
    hub.tamper("test/split-GGUF", SHARDS[1])
    with pytest.raises(ChecksumMismatchError, match=f"^{SHARDS[1]} from test/split-GGUF@") as refused:
        pull("split", endpoint=hub.endpoint, progress=False)
    served = hub.repos["test/split-GGUF"].served[SHARDS[1]]
    assert refused.value.actual == sha256(served)
    hub.requests.clear()
    pull("split", endpoint=hub.endpoint, progress=False, accept_hashes=[sha256(served)])  # that shard only
    assert [n for n in hub.resolve_gets() if n.startswith("split")] == [SHARDS[2]]
    first = resolve_pair("split").target
    files = hub.repos["test/split-GGUF"].files
    assert [(first.parent / n).read_bytes() for n in SHARDS] == [files[SHARDS[0]], served, files[SHARDS[2]]]


def write_split(source: Path, folder: Path, shards: int) -> Path:
    """source rewritten as llama.cpp split files with the gguf package; the first shard."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    per_shard = -(-len(reader.tensors) // shards)
    writer = gguf.GGUFWriter(folder / "split.gguf", arch, split_max_tensors=per_shard)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    first = folder / f"split-00001-of-{shards:05d}.gguf"
    assert sorted(p.name for p in folder.iterdir()) == list(split_shards(first.name))
    return first


@pytest.fixture(scope="module")
def split_model(smollm2_q4_1: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_split(smollm2_q4_1, tmp_path_factory.mktemp("split"), 3)


@pytest.mark.model
def test_llamacpp_opens_a_split_model_by_its_first_shard(split_model: Path, target_backend) -> None:
    from model_support import load_llamacpp

    from localspec.common.gguf_header import gguf_vocab_identity

    split = load_llamacpp(split_model)
    try:
        tokens = target_backend.tokenize("The sky is blue because", add_special=True, parse_special=False)
        target_backend.rollback(0)
        expected = np.array(target_backend.eval_block(tokens))
        assert np.array_equal(np.array(split.eval_block(tokens)), expected)
        assert gguf_vocab_identity(split_model) == split.vocab_identity()
    finally:
        split.close()


@pytest.mark.model
def test_quantize_reads_split_input(split_model: Path, tmp_path: Path) -> None:
    from model_support import load_llamacpp

    from localspec.backends.llamacpp.copies import derived

    made = derived(split_model, "Q8_0", tmp_path)
    assert made.name == "split.Q8_0.gguf"  # one file, named without the shard suffix
    backend = load_llamacpp(made)
    try:
        assert backend.info.n_layers == 30
    finally:
        backend.close()
