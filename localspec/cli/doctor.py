"""`localspec doctor`: what this machine is, and what speculation can gain on it."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import Any

from localspec.backends.llamacpp.rpc_server import INSTALL_WITH_RPC, rpc_available
from localspec.cli.options import MODEL_HELP, model_files, threads_arg
from localspec.common.progress import Steps, reporting
from localspec.control import contention
from localspec.control.calibrate import Calibration, calibrated
from localspec.control.config import DEFAULT
from localspec.control.hardware import DeviceProbe, host_kind, predict_verify_seconds, probe
from localspec.control.policy import decide_static
from localspec.core.backend_loader import kind_of, load_backend
from localspec.core.drafting import Decision
from localspec.core.protocol import Capabilities, Exactness, ModelInfo
from localspec.models.naming import canonical_name


def register(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="probe the machine and the cost of verifying k tokens",
        description="Probe CPU, SIMD and memory bandwidth; with a model, show its measured "
        "verification cost curve and the draft lengths it leads to.",
    )
    p.add_argument("--model", "-m", metavar="MODEL", help=f"the model to time: {MODEL_HELP}")
    p.add_argument("--backend", default="llamacpp")
    p.add_argument(
        "--threads",
        type=threads_arg,
        help="CPU threads to time the model with (default or 0: the physical cores other programs leave free); "
        "the curve is cached per thread count",
    )
    p.add_argument(
        "--refresh", action="store_true", help="measure the machine and the model's cost curve again, not the cache's"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--exact",
        action="store_true",
        help="measure the model with --exact's kernels, beside the default's (a llama.cpp without llamafile)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="print the draft lengths the policy weighed")
    p.set_defaults(handler=handle)


@dataclass(frozen=True)
class Findings:
    """What doctor measured: the machine, the model on it, and the figures that follow from both."""

    model: str  # the model file
    device: DeviceProbe
    cal: Calibration
    info: ModelInfo
    capabilities: Capabilities
    predicted: list[float]  # a pass over k tokens, predicted from the model's size and the machine
    decisions: dict[str, Decision]  # the policy's choice at each acceptance, for a free drafter
    warnings: list[str]

    @property
    def choices(self) -> dict[str, int]:
        return {a: d.chosen for a, d in self.decisions.items()}


def handle(args: argparse.Namespace) -> int:
    found = examine(args)
    if args.json:
        print(json.dumps(_as_json(found), indent=1))
        return 0
    _print_machine(found.device, args.backend, found.capabilities)
    _print_curve(found)
    if args.verbose:
        print(f"at acceptance 0.80 the policy weighed\n{found.decisions['0.80'].table()}")
    if getattr(args, "exact", False):
        print(f"--exact      {_exact_cost(found.model, args.backend, found.cal.verify_seconds)}")
    for warning in found.warnings:
        print(f"note: {warning}")
    return 0


def examine(args: argparse.Namespace) -> Findings:
    """Probe the machine, load the model and time its passes (cached once per model and machine)."""
    with Steps("localspec doctor", total=4) as progress:
        progress.step("finding the model")
        model, _ = model_files(args)  # a model that is not there is said before the long steps
        progress.step("measuring this machine (memory bandwidth, compute)")
        device = probe(refresh=args.refresh)
        before = contention.sample()
        progress.step(f"loading {canonical_name(model)}")
        options: dict[str, Any] = {"exact": True} if getattr(args, "exact", False) else {}
        if getattr(args, "threads", None):
            options["threads"] = args.threads
        backend = load_backend(args.backend, model, **options)
        try:
            progress.step("timing the model's passes (once per model and machine; --refresh times them again)")
            with reporting(progress.detail):
                cal = calibrated(backend, refresh=args.refresh)
            info, capabilities = backend.info, backend.capabilities
            crowded = contention.threads_notice(capabilities, "pass --threads 1")
        finally:
            backend.close()
        busy = contention.busiest([before, contention.sample()])
    curve = cal.verify_seconds
    predicted = [
        predict_verify_seconds(info.size_bytes, info.n_params, device, k, capabilities.device)
        for k in range(1, len(curve) + 1)
    ]
    decisions = {f"{a:.2f}": decide_static(curve, a, 0.0, DEFAULT.max_draft) for a in (0.5, 0.7, 0.8, 0.9, 0.95)}
    warnings = doctor_warnings(busy, cal.decode_seconds, curve[0], predicted[0]) + ([crowded] if crowded else [])
    return Findings(model, device, cal, info, capabilities, predicted, decisions, warnings)


def _as_json(found: Findings) -> dict[str, Any]:
    cal, deep = found.cal, found.cal.deep_verify_seconds
    return {
        "device": asdict(found.device),
        "model": canonical_name(found.model),
        "model_name": found.info.name,
        "verify_ms": [t * 1e3 for t in cal.verify_seconds],
        "verify_ms_deep": [t * 1e3 for t in deep] if deep else None,
        "deep_depth": cal.deep_depth if deep else None,
        "rebuild_ms": {
            "into_block": cal.rebuild_block_seconds * 1e3,
            "into_one": cal.rebuild_one_seconds * 1e3,
        },
        "predicted_ms": [t * 1e3 for t in found.predicted],
        "gamma_for_acceptance": found.choices,
        "llamacpp_rpc": rpc_available(),
        "host_kind": host_kind(),
        "warnings": found.warnings,
    }


def _print_machine(device: DeviceProbe, backend: str, capabilities: Capabilities) -> None:
    print(
        f"CPU          {device.cpu} ({device.machine}), {device.physical_cores} physical / "
        f"{device.logical_cores} logical cores, {device.memory_gib:.0f} GiB"
    )
    print(f"SIMD         {' '.join(device.simd) or 'none detected'} (host kind {host_kind()})")
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
    print(f"greedy       {_bit_exact_line(capabilities.exactness)}")
    print(f"reuse        {_reuse_line(capabilities.exactness)}")
    if kind_of(backend).gpu_layers:
        print(f"llama.cpp    {_gpu_line(capabilities.gpu)}")


def _print_curve(found: Findings) -> None:
    info, cal, curve, deep = found.info, found.cal, found.cal.verify_seconds, found.cal.deep_verify_seconds
    size = f"{info.size_bytes / 2**20:.0f} MiB, {info.n_params / 1e6:.0f}M parameters"
    print(f"model        {canonical_name(found.model)} ({info.name}) on {found.capabilities.device}: {size}")
    print("")
    print("What one pass of the model over k tokens costs (verifying a draft of k-1 tokens takes one such pass):")
    print("verify k     " + " ".join(f"{k:>6}" for k in range(1, len(curve) + 1)))
    print("measured ms  " + " ".join(f"{t * 1e3:>6.1f}" for t in curve) + "   (behind a short context)")
    if deep:
        print(f"after {cal.deep_depth:<6} " + " ".join(f"{t * 1e3:>6.1f}" for t in deep))
        print(f"             (the same passes behind {cal.deep_depth} tokens of context, where attention costs more)")
    print("predicted ms " + " ".join(f"{t * 1e3:>6.1f}" for t in found.predicted))
    print("             (from the model's size and this machine's bandwidth and compute, before any timing)")
    print(f"cost of k=4 vs one decode step: {curve[3] / curve[0]:.2f}x")
    print(
        f"a pass after one of another size pays {cal.rebuild_block_seconds * 1e3:.2f} ms more into a block, "
        f"{cal.rebuild_one_seconds * 1e3:.2f} ms back into one token (graph rebuild)"
    )
    print("")
    print("γ (gamma) is the draft length: how many tokens a drafter guesses before the model checks them in one pass.")
    print(
        "For a free drafter (one whose guesses cost nothing, like n-gram lookup), the γ that gives the most "
        "tokens per second at each acceptance (the share of guesses the model keeps):"
    )
    print("  " + ", ".join(f"acceptance {a}: γ={g}" for a, g in found.choices.items()))
    print("  (γ=0 means drafting does not pay at that acceptance: it decodes plainly, never slower)")


def doctor_warnings(busy: contention.Contention | None, decode: float, one: float, predicted: float) -> list[str]:
    """What makes the figures above doubtful, in words."""
    notes = []
    if busy is not None:
        notes.append(contention.unreliable_note(busy.describe()))
    elif contention.noisy(decode, one):
        notes.append(
            contention.unreliable_note(
                f"one single-token pass timed {decode * 1e3:.1f} ms one way and {one * 1e3:.1f} ms the other"
            )
        )
    ratio = one / predicted if predicted > 0 else 1.0
    if ratio > 3:
        notes.append(
            f"a pass measured {ratio:.0f}x the prediction: the prediction is a lower bound that assumes the "
            "weights stream at the measured bandwidth and nothing else runs; other programs on the cores, a "
            "small model's fixed cost per pass, or threads fighting over cores make up the difference"
        )
    return notes


def _exact_cost(model: str, backend: str, exact_curve: list[float]) -> str:
    """--exact's verify passes against the default kernels' on this machine. ggml reads its
    kernel switch once per process, so the default curve comes from a process of its own."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "localspec", "doctor", "--model", model, "--backend", backend, "--json"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return "the default kernels' curve could not be measured: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    default = json.loads(done.stdout)["verify_ms"]
    sizes = [k for k in (1, 5, 9, 17) if k <= min(len(default), len(exact_curve))]
    ratios = ", ".join(f"{k} tokens {exact_curve[k - 1] * 1e3 / default[k - 1]:.2f}x" for k in sizes)
    return f"a verify pass takes, against the default kernels' time: {ratios}"


def _gpu_line(gpu: str | None) -> str:
    from localspec.backends.llamacpp.gpu import gpu_backends

    if gpu:
        return f"decodes on {gpu}; --gpu-layers N moves fewer layers there"
    built = gpu_backends()
    if built:  # a Vulkan build skips CPU-type devices (Mesa's lavapipe) unless told to use them
        hint = " (GGML_VK_VISIBLE_DEVICES=0 picks a software Vulkan device)" if "Vulkan" in built else ""
        return f"decodes on the CPU: this {'/'.join(built)} build sees no GPU{hint}"
    return "decodes on the CPU: this build has no GPU backend (a Metal, CUDA or Vulkan build offloads by itself)"


def _exact_line() -> str:
    from localspec.backends.llamacpp.library import EXACT_BUILD, batch_invariant_build, cpu_kernels

    kernels = f"CPU kernels for {cpu_kernels()}"
    if batch_invariant_build():
        return f"{kernels}, built without llamafile: --exact gives plain decoding's greedy output bit for bit"
    return f"{kernels}, built with llamafile: --exact needs {EXACT_BUILD}"


def _bit_exact_line(exactness: Exactness) -> str:
    """What this model's greedy speculation is, by construction, with the default kernels."""
    if exactness.cells == 0:
        return f"speculation may part from plain decoding at near-ties: {exactness.why} (--exact: bit for bit)"
    rows = exactness.rows
    if rows is not None and rows <= DEFAULT.max_draft:  # a device's checked block sizes (device_check.py)
        if rows <= 1:
            return f"speculation may part from plain decoding at near-ties: {exactness.why}"
        return (
            f"speculation gives plain decoding's output bit for bit with drafts of up to {rows - 1} token"
            f"{'s' if rows > 2 else ''}; "
            f"longer ones may part at near-ties: {exactness.why}"
        )
    if exactness.cells is None:
        return "speculation gives plain decoding's output bit for bit at any length"
    return (
        f"speculation gives plain decoding's output bit for bit up to {exactness.cells} tokens of context; "
        f"past that {exactness.why} (--exact: at any length)"
    )


def _reuse_line(exactness: Exactness) -> str:
    """Whether a prefix cached from earlier answers gives a fresh evaluation's logits."""
    if exactness.prompt_rows is None:
        return "a cached prefix reused from earlier answers gives a fresh evaluation's output bit for bit"
    return (
        f"a cached prefix reused from earlier answers may part at near-ties from a fresh evaluation that takes "
        f"a block of more than {exactness.prompt_rows} tokens: {exactness.prompt_why} (serve reuses only a "
        "fresh evaluation's own blocks unless a request sends cache_prompt: true)"
    )


def _rpc_line() -> str:
    if rpc_available():
        return "RPC backend built in: --rpc can split a target over rpc-servers"
    return f"no RPC backend: --rpc needs {INSTALL_WITH_RPC}"
