"""Which part of localspec's llama.cpp load crashes a GPU build: each variant loads the model
in a process of its own (a segfault ends only that one) and prints its exit status, from
llama.cpp's own defaults (what llama-bench passes) one localspec setting at a time up to
localspec's whole load. Issue #40: `localspec run` segfaulted inside
llama_model_load_from_file on a CUDA build where llama-bench ran the same file.

    python benchmarks/gpu_load_bisect.py MODEL.gguf [--only NAME]

Exit status -11 is SIGSEGV; a crashed variant's last lines (llama.cpp's log, faulthandler's
Python stack) follow its row. On a CPU build every variant loads (the GPU layers have nowhere
to go). docs/gpu.md says what each outcome would mean.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def load_raw(path: str, gpu_layers: int | None, log: bool, mtp: bool, repack: bool, probe: bool) -> None:
    """llama.cpp's default model parameters with the named localspec settings on top."""
    import llama_cpp as llama

    if log:
        from localspec.backends.llamacpp import library

        library.init_library()  # localspec's log callback, then llama_backend_init
    if probe:
        from localspec.backends.llamacpp import gpu

        print(f"  gpu_device(): {gpu.gpu_device()}", flush=True)
    if not log:
        llama.llama_backend_init()
    params = llama.llama_model_default_params()
    if gpu_layers is not None:
        params.n_gpu_layers = gpu_layers
    params.load_mtp = mtp
    if not repack:
        params.use_extra_bufts = False
    model = llama.llama_model_load_from_file(os.fsencode(path), params)
    if not model:
        raise SystemExit("llama_model_load_from_file returned NULL")
    llama.llama_model_free(model)


def auto_layers(path: str) -> int:
    from localspec.backends.llamacpp import gpu

    return gpu.auto_gpu_layers(path, gpu.gpu_device())


def variants(path: str) -> dict[str, str]:
    """name -> the Python statement the child runs."""
    raw = "from gpu_load_bisect import load_raw; load_raw({path!r}, {layers}, {log}, {mtp}, {repack}, {probe})"

    def r(layers: str = "None", log: bool = False, mtp: bool = False, repack: bool = True, probe: bool = False) -> str:
        return raw.format(path=path, layers=layers, log=log, mtp=mtp, repack=repack, probe=probe)

    full = "from localspec.backends.llamacpp.backend import LlamaCppBackend; LlamaCppBackend({path!r}{extra}).close()"
    return {
        "llama.cpp defaults (all layers, as llama-bench -ngl 99)": r(),
        "+ localspec's log callback": r(log=True),
        "+ load_mtp": r(mtp=True),
        "+ repacking off": r(repack=False),
        "+ the GPU probe before the load": r(probe=True),
        "+ localspec's automatic layer count": r(layers=f"__import__('gpu_load_bisect').auto_layers({path!r})"),
        "localspec's load, gpu_layers=0": full.format(path=path, extra=", gpu_layers=0"),
        "localspec's load, automatic GPU layers": full.format(path=path, extra=""),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--only", help="run the variants whose name contains this")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    for name, code in variants(args.model).items():
        if args.only and args.only not in name:
            continue
        t0 = time.perf_counter()
        try:
            cmd = [sys.executable, "-X", "faulthandler", "-c", code]
            done = subprocess.run(cmd, env=env, timeout=args.timeout, capture_output=True, text=True)
            status = (
                "ok" if done.returncode == 0 else f"exit {done.returncode}" + (" (SIGSEGV)" * (done.returncode == -11))
            )
            tail = "" if done.returncode == 0 else "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        except subprocess.TimeoutExpired:
            status, tail = f"no answer in {args.timeout:.0f} s", ""
        print(f"{name:<60} {status:<18} {time.perf_counter() - t0:6.1f} s", flush=True)
        if tail:  # llama.cpp's last lines and faulthandler's stack
            print("    " + tail.replace("\n", "\n    "), flush=True)


if __name__ == "__main__":
    main()
