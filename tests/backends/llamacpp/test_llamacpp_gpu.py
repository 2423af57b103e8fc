"""Where llama.cpp's layers run: on the GPU of a Metal, CUDA or Vulkan build (every layer
that fits, unless --gpu-layers says otherwise), on the CPU of a build without one. CI's
build is a CPU one with RPC, which llama_supports_gpu_offload() calls offload-capable;
.ci/vulkan.sh runs this file on a Vulkan build with Mesa's software device."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")

from localspec.backends.llamacpp import backend as llamacpp
from localspec.backends.llamacpp.backend import GPU_RESERVE, GpuDevice, LlamaCppBackend, gpu_layers_that_fit
from localspec.backends.llamacpp.gpu import gpu_backends
from localspec.backends.llamacpp.greedy import rows_aligned
from localspec.cli.main import main
from localspec.testing.gguf_writer import Spec, write_gguf

GiB = 1 << 30


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(Spec("llama"), tmp_path_factory.mktemp("gpu") / "llama.gguf")


def test_a_build_without_a_gpu_backend_decodes_on_the_cpu(tiny: Path) -> None:
    if gpu_backends():
        pytest.skip(f"a {'/'.join(gpu_backends())} build: test_a_gpu_build_decodes_on_its_device is its test")
    assert llamacpp.gpu_device() is None  # an RPC build: its rpc devices are other machines'
    model = LlamaCppBackend(str(tiny), n_ctx=64)
    try:
        assert model.capabilities.device == "cpu" and "gpu" not in model.capabilities.extra
    finally:
        model.close()


def test_a_gpu_build_decodes_on_its_device(tiny: Path) -> None:
    device = llamacpp.gpu_device()
    if device is None:
        pytest.skip("no GPU seen: a CPU build, or a Vulkan one not told GGML_VK_VISIBLE_DEVICES=0 on a software device")
    assert gpu_backends(), "a GPU device comes from one of the build's GPU backends, never an RPC one"
    model = LlamaCppBackend(str(tiny), n_ctx=64)
    try:
        assert model._options["gpu_layers"] == model.info.n_layers + 1  # a tiny model fits: every layer
        assert model.capabilities.device == "gpu" and model.capabilities.extra["gpu"].startswith(device.name)
        # The output layer is on the GPU: greedy blocks take its argmax, on Vulkan only where its
        # rows can be viewed (greedy.rows_aligned: this tiny vocabulary's cannot).
        assert model._greedy.wanted == rows_aligned(model.info.n_vocab, gpu_backends())
    finally:
        model.close()


def test_doctor_says_why_a_gpu_build_decodes_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.backends.llamacpp import gpu
    from localspec.cli import doctor

    monkeypatch.setattr(gpu, "gpu_backends", lambda: ("Vulkan",))
    assert "GGML_VK_VISIBLE_DEVICES=0" in doctor._gpu_line(None)  # lavapipe is a CPU-type device
    monkeypatch.setattr(gpu, "gpu_backends", lambda: ())
    assert "has no GPU backend" in doctor._gpu_line(None)
    assert doctor._gpu_line("llvmpipe (LLVM 19.1.7, 256 bits) (31 layers)").startswith("decodes on llvmpipe")


def test_every_layer_goes_to_a_gpu_the_weights_fit_and_a_share_where_they_do_not() -> None:
    roomy = GpuDevice("roomy", 8 * GiB)
    assert gpu_layers_that_fit(32, 5 * GiB, roomy) == 33  # the output layer too
    tight = GpuDevice("tight", 3 * GiB + GPU_RESERVE)
    assert gpu_layers_that_fit(32, 6 * GiB, tight) == 16
    assert gpu_layers_that_fit(32, 6 * GiB, GpuDevice("full", GPU_RESERVE // 2)) == 0
    assert gpu_layers_that_fit(32, 6 * GiB, None) == 0


def test_the_choice_reaches_llama_cpp_and_names_the_device(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "gpu_device", lambda: GpuDevice("Test GPU", 8 * GiB))
    model = LlamaCppBackend(str(tiny), n_ctx=64)
    try:
        assert model._options["gpu_layers"] == model.info.n_layers + 1
        assert model.capabilities.extra["gpu"].startswith("Test GPU")
        assert model.capabilities.device == "gpu"
    finally:
        model.close()
    every = LlamaCppBackend(str(tiny), n_ctx=64, gpu_layers=99)  # --gpu-layers 99: llama.cpp's "all"
    try:
        assert every.capabilities.extra["gpu"] == f"Test GPU ({every.info.n_layers + 1} layers)"
    finally:
        every.close()
    chosen = LlamaCppBackend(str(tiny), n_ctx=64, gpu_layers=0)  # --gpu-layers 0: the CPU only
    try:
        assert chosen.capabilities.device == "cpu" and chosen._options["gpu_layers"] == 0
    finally:
        chosen.close()


def test_gpu_layers_on_the_command_line(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-m", str(tiny), "--gpu-layers", "0", "-t", "0", "--max-tokens", "4", "hi"]) == 0
    # 99: more than the model has, every layer (llama.cpp clamps); on a CPU build, none.
    assert main(["run", "-m", str(tiny), "--gpu-layers", "99", "-t", "0", "--max-tokens", "4", "hi"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["run", "-m", str(tiny), "--gpu-layers", "-2", "hi"])
    assert "whole number of layers" in capsys.readouterr().err
    code = main(["run", "-m", str(tiny), "--backend", "torch", "--gpu-layers", "3", "--max-tokens", "4", "hi"])
    assert code != 0 and "--backend llamacpp" in capsys.readouterr().err


def test_the_bindings_read_llama_cpps_own_model_defaults() -> None:
    # The load passes llama_model_params by value through ctypes: a binding whose fields sit
    # elsewhere than the library's (libraries copied under another llama-cpp-python, issue
    # #40's crash set-up) would hand llama.cpp a shifted struct. Its own defaults read back.
    import llama_cpp

    from localspec.backends.llamacpp.build import _model_params

    params, _ = _model_params((), 7)
    assert params.n_gpu_layers == 7
    defaults = llama_cpp.llama_model_default_params()
    assert defaults.n_gpu_layers == -1 and defaults.split_mode == llama_cpp.LLAMA_SPLIT_MODE_LAYER
    assert defaults.main_gpu == 0 and not defaults.devices and not defaults.tensor_split
    assert not defaults.tensor_buft_overrides and not defaults.kv_overrides
    assert (defaults.vocab_only, defaults.check_tensors, defaults.use_extra_bufts) == (False, False, True)
    assert (defaults.no_host, defaults.no_alloc, defaults.load_mtp) == (False, False, False)


def test_lanes_decode_where_a_lone_request_does_and_give_its_answers(tiny: Path) -> None:
    """serve --parallel on a GPU build: the lanes on the device, as a lone request (not one
    request at a time); a shared pass no wider than the blocks the load's device check found
    identical to one-token passes (device_check.py; the CPU's kernel plan on a CPU build); each
    answer the one the request gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    from localspec.api import load
    from localspec.pool import load_pool

    prompts = ["one two three one two three one two", "a b c d a b c d a b c", "x y z x y z"]
    options = {"n_ctx": 256, "strategy": "ngram", "memory": False, "gpu_layers": 99, "threads": 1}
    with load(str(tiny), **options) as alone:
        lone = [alone.generate(p, max_tokens=24, temperature=0).text for p in prompts]
    pool = load_pool(str(tiny), parallel=2, **options)
    try:
        assert len(pool.runtimes) == 2 and pool.note is None
        host = pool.runtimes[0].target.host
        caps = host.model.capabilities
        assert caps.device == ("gpu" if llamacpp.gpu_device() is not None else "cpu")
        found = caps.exactness.prompt_rows
        assert host.row_limit == (caps.max_block if found is None else max(found, 1))
        with ThreadPoolExecutor(2) as ask:
            together = list(ask.map(lambda p: pool.generate(p, max_tokens=24, temperature=0).text, prompts))
        assert together == lone
        assert host.figures.passes > 0
    finally:
        pool.close()


def test_lanes_on_the_device_stop_mid_answer_from_another_thread_or_a_cancelled_task(tiny: Path) -> None:
    """A lane's answer ended mid-way on the device (its stream closed from another thread, or
    its asyncio task cancelled) frees the lane within a step, leaves the lane beside it
    answering as alone, and the next request on the freed lane gets its lone answer: what
    close() and cancel do on the CPU's lanes (tests/api/test_pool.py), with the lanes' passes on
    the device's cache."""
    import asyncio
    import threading

    from localspec.api import load
    from localspec.events import Finished
    from localspec.pool import load_pool

    long_prompt, side = "one two three one two three one two", "x y z x y z"
    options = {"n_ctx": 256, "strategy": "ngram", "memory": False, "gpu_layers": 99, "threads": 1}
    with load(str(tiny), **options) as alone:
        lone_side = alone.generate(side, max_tokens=16, temperature=0).text
        lone_long = alone.generate(long_prompt, max_tokens=200, temperature=0)
    assert lone_long.stats.generated_tokens == 200  # long enough to be stopped mid-way
    pool = load_pool(str(tiny), parallel=2, **options)
    try:
        on = pool.runtimes[0].target.host.model.capabilities.device
        assert len(pool.runtimes) == 2 and on == ("gpu" if llamacpp.gpu_device() is not None else "cpu")
        with pool.lane() as lane:  # closed from another thread once the lane beside it answered
            stream = lane.stream(long_prompt, max_tokens=200, temperature=0)
            answered: list[str] = []

            def beside_then_close() -> None:
                answered.append(pool.generate(side, max_tokens=16, temperature=0, lane_timeout=120).text)
                stream.close()

            closer = threading.Thread(target=beside_then_close)
            closer.start()
            rest = list(stream)
            closer.join(120)
        assert answered == [lone_side]
        last = rest[-1]
        assert isinstance(last, Finished) and last.finish_reason == "cancelled"
        assert last.stats.generated_tokens < 200

        async def cancelled_then_asked() -> str:
            decoding = asyncio.Event()

            async def read_long() -> None:
                async with pool.alane() as runtime:
                    async for _ in runtime.astream(long_prompt, max_tokens=200, temperature=0):
                        decoding.set()

            task = asyncio.ensure_future(read_long())
            await asyncio.wait_for(decoding.wait(), 120)  # cancelled mid-answer
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            else:
                raise AssertionError("the cancelled task read its answer to the end")
            answers = await asyncio.gather(
                *(pool.agenerate(side, max_tokens=16, temperature=0, lane_timeout=120) for _ in range(2))
            )
            return "|".join(answer.text for answer in answers)

        assert asyncio.run(cancelled_then_asked()) == f"{lone_side}|{lone_side}"
    finally:
        pool.close()
