"""The device probe: what it reads from the machine, how it is cached, and how the roofline
prediction picks the memory the weights stream from."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from localspec.control import hardware
from localspec.control.accelerators import Accelerator, apple_chip_bandwidth, cuda_spec_bandwidth, probe_accelerators
from localspec.control.hardware import DeviceProbe, predict_verify_seconds, probe

CPU = DeviceProbe("test cpu", "x86_64", 2, 2, 24.0, ("avx2",), bandwidth_gbs=35.0, gflops=100.0)
H100 = Accelerator("cuda", "NVIDIA H100 80GB HBM3", 79.2, spec_bandwidth_gbs=3352.0, measured_bandwidth_gbs=2900.0)


@pytest.mark.parametrize(
    ("brand", "gbs"),
    [("Apple M1", 68.25), ("Apple M2 Max", 400.0), ("Apple M4 Pro", 273.0), ("Apple M9 Turbo", None), ("Intel", None)],
)
def test_apple_chips_map_to_their_unified_memory_bandwidth(brand: str, gbs: float | None) -> None:
    assert apple_chip_bandwidth(brand) == gbs


def test_cuda_bandwidth_comes_from_memory_clock_and_bus_width() -> None:
    h100_sxm = SimpleNamespace(memory_clock_rate=2_619_000, memory_bus_width=5120)  # kHz, bits
    assert cuda_spec_bandwidth(h100_sxm) == pytest.approx(3352, rel=0.01)
    assert cuda_spec_bandwidth(SimpleNamespace()) is None  # an older torch without the fields


def test_this_cpu_only_machine_reports_no_accelerator() -> None:
    # CI and this machine: torch's CPU build, Linux. A GPU machine would list its devices.
    assert probe_accelerators() == ()


def test_the_prediction_streams_weights_from_the_memory_the_backend_runs_on() -> None:
    device = replace(CPU, accelerators=(H100,))
    size, params = 270_000_000, 135_000_000
    on_cpu = predict_verify_seconds(size, params, device, 1, "cpu")
    on_gpu = predict_verify_seconds(size, params, device, 1, "cuda")
    assert on_cpu == pytest.approx(size / 35e9)
    assert on_gpu == pytest.approx(size / 2900e9)  # the measured figure wins over the specification
    assert predict_verify_seconds(size, params, CPU, 1, "cuda") == on_cpu  # no GPU probed: the CPU's


def test_the_probe_is_cached_with_its_accelerators(temporary_localspec_home: Path, monkeypatch) -> None:
    calls: list[int] = []

    def fake_accelerators() -> tuple[Accelerator, ...]:
        calls.append(1)
        return (H100,)

    monkeypatch.setattr(hardware, "probe_accelerators", fake_accelerators)
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda threads: 35.0)
    monkeypatch.setattr(hardware, "measure_gflops", lambda: 100.0)
    first = probe()
    second = probe()
    assert calls == [1]  # measured once
    assert second == first and second.accelerator_for("cuda") == H100
    assert second.accelerator_for("cpu") is None
