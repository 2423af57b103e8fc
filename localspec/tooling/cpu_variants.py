"""llama.cpp's CPU kernels built for another host kind, so a test or a benchmark on one host
sees what another computes: which near-ties tip depends on the instruction set ggml-cpu was
built for (AVX2, or AVX-512 with VNNI and BF16), and the project's machines are of both kinds.

llama-cpp-python links its CPU backend as a library of its own (libggml-cpu.so.0, found
through its RUNPATH); a copy of that one library, built from the same vendored source for a
named variant (ggml's own names, GGML_CPU_ALL_VARIANTS), takes its place in a process started
with LD_LIBRARY_PATH pointing at it. A variant runs only on a CPU with its features: an AVX2
host cannot run AVX-512 kernels, so there the AVX-512 side is left to an AVX-512 host.

    python -m localspec.tooling.cpu_variants build haswell      # ~3 minutes on 2 cores
    python -m localspec.tooling.cpu_variants list
    python -m localspec.tooling.cpu_variants run haswell -- python -m pytest tests/backends/llamacpp/test_host_kinds.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from localspec.control.hardware import cpu_flags, physical_cores
from localspec.core.errors import BackendUnavailableError, InvalidRequestError
from localspec.tooling.peers import fetch_source, peers_dir

# ggml's CMake switches for x86 features; a variant turns on its own and off the rest.
GGML_FEATURES = (
    "AVX",
    "AVX2",
    "AVX_VNNI",
    "FMA",
    "F16C",
    "BMI2",
    "AVX512",
    "AVX512_VBMI",
    "AVX512_VNNI",
    "AVX512_BF16",
    "AMX_TILE",
    "AMX_INT8",
    "AMX_BF16",
)


@dataclass(frozen=True)
class Variant:
    name: str
    features: tuple[str, ...]  # GGML_<feature>=ON
    needs: tuple[str, ...]  # /proc/cpuinfo flags a CPU must have to run it
    kind: str  # the host kind it stands for, as figures name it


_HASWELL = ("AVX", "AVX2", "FMA", "F16C", "BMI2")
_HASWELL_NEEDS = ("avx", "avx2", "fma", "f16c", "bmi2")
VARIANTS = {
    v.name: v
    for v in (
        Variant("haswell", _HASWELL, _HASWELL_NEEDS, "AVX2"),
        Variant("skylakex", (*_HASWELL, "AVX512"), (*_HASWELL_NEEDS, "avx512f", "avx512bw"), "AVX-512"),
        Variant(
            "zen4",
            (*_HASWELL, "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"),
            (*_HASWELL_NEEDS, "avx512f", "avx512bw", "avx512vbmi", "avx512_vnni", "avx512_bf16"),
            "AVX-512 (VNNI, BF16)",
        ),
    )
}


def variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise InvalidRequestError(f"no CPU variant {name!r}", f"choose one of {', '.join(VARIANTS)}")
    return VARIANTS[name]


def variants_dir() -> Path:
    """Where built variants live: LOCALSPEC_CPU_VARIANTS (CI keeps them across runs), else
    beside llama.cpp's own programs (tooling.peers), per llama-cpp-python version."""
    chosen = os.environ.get("LOCALSPEC_CPU_VARIANTS")
    base = Path(chosen) / f"llama-cpp-python-{version('llama-cpp-python')}" if chosen else peers_dir()
    return base / "cpu-variants"


def library_dir(name: str) -> Path:
    return variants_dir() / variant(name).name


def built(name: str) -> bool:
    return (library_dir(name) / "libggml-cpu.so.0").exists()


def runs_here(name: str) -> bool:
    """Whether this CPU has every feature the variant's kernels use."""
    return set(variant(name).needs) <= cpu_flags()


def environ(name: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """A child process's environment in which llama.cpp runs the variant's CPU kernels."""
    if not built(name):
        raise BackendUnavailableError(
            f"llama.cpp's CPU kernels for {name} are not built",
            f"python -m localspec.tooling.cpu_variants build {name} (about 3 minutes on 2 cores)",
        )
    env = dict(os.environ if base is None else base)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(library_dir(name)), env.get("LD_LIBRARY_PATH")) if p)
    return env


def build(name: str) -> Path:
    """Build ggml-cpu alone for the variant from llama-cpp-python's own sdist; its library
    lands in library_dir(name) whole or not at all."""
    if sys.platform != "linux":
        raise BackendUnavailableError("CPU variants are swapped in through LD_LIBRARY_PATH, on Linux only")
    chosen = variant(name)
    source = fetch_source(peers_dir())
    build_dir = variants_dir() / f"build-{chosen.name}"
    switches = [f"-DGGML_{f}={'ON' if f in chosen.features else 'OFF'}" for f in GGML_FEATURES]
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF"]
    flags += [f"-DLLAMA_BUILD_{part}=OFF" for part in ("TESTS", "EXAMPLES", "TOOLS", "SERVER", "COMMON")]
    _run(["cmake", "-S", str(source), "-B", str(build_dir), *flags, *switches])
    _run(["cmake", "--build", str(build_dir), "-j", str(physical_cores()), "--target", "ggml-cpu"])
    target = library_dir(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp) / chosen.name
        staged.mkdir()
        for lib in (build_dir / "bin").glob("libggml-cpu.so*"):
            shutil.copy2(lib, staged / lib.name, follow_symlinks=True)
        shutil.rmtree(target, ignore_errors=True)
        staged.rename(target)
    return target


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise BackendUnavailableError(f"building llama.cpp's CPU kernels failed: {' '.join(cmd[:3])}...\n{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localspec.tooling.cpu_variants", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build")
    build_cmd.add_argument("names", nargs="+", choices=list(VARIANTS))
    build_cmd.add_argument("--force", action="store_true", help="build again even where built before")
    sub.add_parser("list")
    sub.add_parser("path").add_argument("name", choices=list(VARIANTS))
    run = sub.add_parser("run")
    run.add_argument("name", choices=list(VARIANTS))
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "build":
        for name in args.names:
            done = built(name) and not args.force
            print(
                f"{name}: {library_dir(name) if done else build(name)}{' (built before)' if done else ''}", flush=True
            )
    elif args.command == "list":
        for v in VARIANTS.values():
            state = "built" if built(v.name) else "not built"
            print(f"{v.name:<9} {v.kind:<21} {state}, {'runs' if runs_here(v.name) else 'cannot run'} on this CPU")
    elif args.command == "path":
        print(library_dir(args.name))
    else:
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return subprocess.run(cmd, env=environ(args.name), check=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
