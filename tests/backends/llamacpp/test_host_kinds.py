"""The row counts the kernel plan names hold on every host kind the project runs on.

Each kind runs in a child process: this host's own build ("native"), and each of ggml's CPU
variants built here (localspec.tooling.cpu_variants) that this CPU can run. So an AVX-512
host checks the AVX2 kernels too; an AVX2 host cannot run AVX-512 kernels and leaves them to
an AVX-512 host (CI runs on both kinds). What must hold on each: a block of up to the plan's
prompt_rows gives one-token passes' logits bit for bit (what bit_exact and verify blocks rely
on), a prompt cut into other pieces of 64+ rows gives the same logits as whole blocks (what
eval_chunked's cancellable pieces rely on), and a prefix kept from another text's 64+-row block
with the rest in a 64+-row block gives them too (what localspec.core.reuse keeps a long prompt's
cached prefix on). How far larger blocks part is not asserted: it is the near-ties it tips that
differ between kinds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localspec.tooling import cpu_variants

pytestmark = pytest.mark.model

KINDS = ["native", *cpu_variants.VARIANTS]
QUANTS = ("Q4_0", "Q8_0", "Q4_K_M", "F16")  # F16: tinyBLAS from 2 rows, so its large blocks above all
# Read before the tests point LOCALSPEC_HOME at a temporary folder: variants are built once a machine.
BUILT_IN = cpu_variants.variants_dir()


def _environment(kind: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setattr(cpu_variants, "variants_dir", lambda: BUILT_IN)
    if kind == "native":
        return dict(os.environ)
    if not cpu_variants.runs_here(kind):
        pytest.skip(
            f"this CPU cannot run {kind}'s kernels ({cpu_variants.VARIANTS[kind].kind}); a host that can checks them"
        )
    if not cpu_variants.built(kind):
        pytest.skip(f"{kind}'s kernels are not built here: python -m localspec.tooling.cpu_variants build {kind}")
    return cpu_variants.environ(kind)


@pytest.fixture(scope="module")
def models(smollm2_q4_1: Path, derived_models: Any) -> list[str]:
    return [str(smollm2_q4_1), *(str(derived_models[q]) for q in QUANTS)]


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_up_to_the_plans_rows_give_one_token_passes_logits_on_every_host_kind(
    kind: str, models, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _environment(kind, monkeypatch)
    child = subprocess.run(
        [sys.executable, "-m", "localspec.testing.block_probe", *models],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    result = json.loads(child.stdout)
    if kind != "native":  # the swapped-in kernels are the variant's, not this host's
        assert ("AVX512 = 1" in result["system_info"]) is ("AVX512" in cpu_variants.VARIANTS[kind].features)
    for path, probed in result["models"].items():
        rows = probed["prompt_rows"]
        name = Path(path).name
        assert rows is not None and rows >= 1, name  # the default kernels always switch somewhere
        for size, parted in probed["blocks_vs_one_token"].items():
            if int(size) <= rows:
                assert parted == 0.0, f"{name}: a block of {size} rows parts by {parted} on {kind}"
        assert set(probed["pieces_vs_whole"].values()) == {0.0}, f"{name} on {kind}: {probed['pieces_vs_whole']}"
        assert set(probed["kept_vs_whole"].values()) == {0.0}, f"{name} on {kind}: {probed['kept_vs_whole']}"


def test_a_variant_not_built_is_refused_with_the_command_that_builds_it(tmp_path, monkeypatch) -> None:
    from localspec.core.errors import BackendUnavailableError

    monkeypatch.setattr(cpu_variants, "variants_dir", lambda: tmp_path)
    with pytest.raises(BackendUnavailableError) as refused:
        cpu_variants.environ("haswell")
    assert refused.value.hint is not None and "cpu_variants build haswell" in refused.value.hint


def test_doctor_names_the_host_kind_and_the_kernels_built_for_it() -> None:
    from localspec.backends.llamacpp.library import cpu_kernels
    from localspec.control.hardware import host_kind

    if "cpu-variants" in os.environ.get("LD_LIBRARY_PATH", ""):
        pytest.skip("another host kind's kernels are swapped in")
    # A native build's kernels are of this host's kind: AVX-512 (VNNI, BF16) hosts get theirs, AVX2 hosts AVX2.
    assert host_kind().split(" ")[0] == cpu_kernels().split(" ")[0]
