"""CLI transcripts for run, bench and doctor on the real default model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from localspec.cli.main import main
from localspec.tooling.bench import BenchRow, bracketing_means, format_table, paired_ratios, paired_speedup

pytestmark = pytest.mark.model


@pytest.fixture
def default_model_in_home(smollm2_q4_1: Path, temporary_localspec_home: Path) -> Path:
    """The embedded default already fetched into this test's user directory, as after a first run."""
    models = temporary_localspec_home / "models"
    models.mkdir(parents=True)
    target = models / smollm2_q4_1.name
    target.symlink_to(smollm2_q4_1)
    return target


def test_run_with_no_model_answers_with_the_embedded_default(default_model_in_home: Path, capsys) -> None:
    code = main(["run", "What is 2+2?", "-t", "0", "-n", "24", "--verbose"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "4" in out
    assert "tok/s decode" in err and "strategy ngram" in err


def test_run_json_prints_text_and_stats(default_model_in_home: Path, capsys) -> None:
    assert main(["run", "Say hello.", "-t", "0", "-n", "8", "--json", "--strategy", "none"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["finish_reason"] in ("stop", "max_tokens")
    assert record["stats"]["generated_tokens"] <= 8
    assert record["stats"]["strategy"] == "none"


def test_run_raw_continues_text_without_the_chat_template(default_model_in_home: Path, capsys) -> None:
    assert main(["run", "1, 2, 3, 4,", "--raw", "-t", "0", "-n", "6", "--stop", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(" 5")
    assert "8" not in out


def test_run_refuses_an_empty_prompt_with_a_hint(default_model_in_home: Path, capsys) -> None:
    assert main(["run", "   "]) == 2
    err = capsys.readouterr().err
    assert "the prompt is empty" in err and "localspec run" in err
    assert "Traceback" not in err


def test_run_with_a_missing_model_file_says_so(tmp_path: Path, capsys) -> None:
    assert main(["run", "hi", "--model", str(tmp_path / "nope.gguf")]) == 2
    assert f"no model file at {tmp_path / 'nope.gguf'}" in capsys.readouterr().err


def test_run_with_an_unknown_strategy_lists_the_choices(default_model_in_home: Path, capsys) -> None:
    assert main(["run", "hi", "--strategy", "bogus"]) == 2
    assert "qspec[:TYPE]" in capsys.readouterr().err


def test_bench_json_has_one_row_per_prompt_and_strategy(default_model_in_home: Path, tmp_path: Path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"id": "count", "prompt": "Count from 1 to 20, comma separated."}\n'
        '{"id": "chat", "messages": [{"role": "user", "content": "Hi!"}]}\n'
    )
    plot = tmp_path / "bench.png"
    code = main(["bench", "--prompts", str(prompts), "-n", "16", "--json", "--plot", str(plot)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["results"]
    assert [(r["prompt"], r["strategy"]) for r in rows] == [("count", "ngram"), ("chat", "ngram")]
    for row in rows:
        for key in ("plain_tokens_per_s", "spec_tokens_per_s", "speedup", "acceptance_rate", "tokens_per_step"):
            assert isinstance(row[key], float)
        assert row["plain_tokens_per_s"] > 0
    assert report["machine"]["physical_cores"] >= 1
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_bench_refuses_an_unwritable_plot_before_running(default_model_in_home: Path, tmp_path: Path, capsys) -> None:
    missing = tmp_path / "no-such-folder" / "bench.png"
    assert main(["bench", "--plot", str(missing), "-n", "4"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "mkdir -p" in err
    assert main(["bench", "--plot", str(tmp_path), "-n", "4"]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_bench_prints_its_figures_when_the_plot_fails_late(
    default_model_in_home: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    # The folder vanishes between the check and the write (or the disk fills up): the
    # figures of the run must still reach the user.
    import localspec.tooling.plot

    monkeypatch.setattr(localspec.tooling.plot, "check_plot_target", lambda path: Path(path))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "count", "prompt": "Count from 1 to 5."}\n')
    gone = tmp_path / "gone" / "bench.png"
    assert main(["bench", "--prompts", str(prompts), "-n", "8", "--json", "--plot", str(gone)]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["results"][0]["prompt"] == "count"
    assert "could not write the plot" in captured.err and "Traceback" not in captured.err


def test_bench_refuses_a_malformed_prompts_file(default_model_in_home: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "no id"}\n')
    assert main(["bench", "--prompts", str(bad)]) == 2
    assert "needs an 'id'" in capsys.readouterr().err


def test_bench_draft_without_a_draft_model_names_the_option(default_model_in_home: Path, capsys) -> None:
    assert main(["bench", "--strategy", "draft"]) == 2
    assert "--draft-model" in capsys.readouterr().err


def test_bench_sweeps_every_layerskip_candidate(default_model_in_home: Path, tmp_path: Path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "count", "prompt": "Count from 1 to 20, comma separated."}\n')
    assert main(["bench", "--prompts", str(prompts), "-n", "8", "--json", "-s", "layerskip:all"]) == 0
    strategies = [r["strategy"] for r in json.loads(capsys.readouterr().out)["results"]]
    # SmolLM2-135M has 30 blocks: early exits after 15 and 22, and every other middle block skipped.
    assert strategies == ["layerskip:15", "layerskip:22", "layerskip:skip-middle-7"]


def test_bench_sweep_on_a_backend_without_derived_files_says_what_to_do(capsys) -> None:
    code = main(["bench", "--backend", "reference", "--model", "reference:seed=1", "-s", "qspec:all", "-n", "4"])
    assert code == 2
    err = capsys.readouterr().err
    assert "name them one by one" in err and "Traceback" not in err


def test_doctor_prints_the_device_and_the_verify_cost_curve(default_model_in_home: Path, capsys) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "model        smollm2-135m (SmolLM2" in out  # the one name every command shows
    assert "bandwidth" in out and "GB/s" in out
    assert "measured ms" in out and "predicted ms" in out and "after 512" in out
    assert "graph rebuild" in out
    assert "--exact" in out  # whether this llama.cpp can give bit-for-bit greedy output
    from localspec.backends.llamacpp.gpu import gpu_device

    device = gpu_device()  # a GPU build's device (llvmpipe on .ci/vulkan.sh's), by name
    assert f"llama.cpp    decodes on {device.name if device else 'the CPU'}" in out


def test_peer_comparison_without_built_programs_says_how_to_build(default_model_in_home: Path, capsys) -> None:
    if shutil.which("llama-lookup"):
        pytest.skip("a llama-lookup is on PATH")
    assert main(["bench", "--only", "chat", "-n", "4", "--peers"]) == 2
    assert "--build-peers" in capsys.readouterr().err


def test_a_burst_of_load_in_one_repeat_does_not_move_the_speedup() -> None:
    plain = [80.0, 80.0, 40.0]  # the third plain run shared the cores with something else
    spec = [120.0, 120.0, 120.0]
    assert paired_speedup(paired_ratios(spec, plain)) == 1.5  # the ratio of totals would say 1.8
    assert paired_speedup(paired_ratios([90.0], [0.0])) == 0.0


def test_plain_runs_on_both_sides_cancel_a_steady_drift() -> None:
    # The machine slows down steadily through a repeat: plain runs at 100 tok/s before the
    # strategy and 80 after it; the strategy, doing the same work in between, runs at 90.
    plain = bracketing_means([100.0, 80.0, 100.0, 80.0])
    assert plain == [90.0, 90.0]
    assert paired_speedup(paired_ratios([90.0, 90.0], plain)) == 1.0  # plain-first alone: 0.9


def test_the_table_says_how_much_of_a_draft_models_drafting_was_lookup() -> None:
    def row(strategy: str, share: float) -> BenchRow:
        return BenchRow("code_edit", strategy, 90.0, 130.0, 1.44, 0.86, 1.98, 1.13, 160, 160, 300.0, lookup_share=share)

    hybrid = format_table([row("ngram", 0.0), row("draft", 0.75)]).splitlines()
    assert hybrid[0].split()[11] == "lookup" and hybrid[2].split()[8] == "-" and hybrid[3].split()[8] == "75%"
    assert "lookup" not in format_table([row("ngram", 0.0)])  # only where a draft model drafted beside it


def test_min_seconds_repeats_a_short_prompt_more_within_a_bound() -> None:
    from localspec.backends.reference import load
    from localspec.control.prompts import BenchPrompt
    from localspec.tooling.bench import MAX_REPEAT_FACTOR, BenchPlan, Contender, bench

    target = load("reference:seed=3")
    prompts = [BenchPrompt("tiny", ({"role": "user", "content": "Count: one two three"},))]
    ngram = [Contender("ngram", "ngram")]
    assert [r.repeats for r in bench(target, ngram, prompts, BenchPlan(max_tokens=4, repeats=2))] == [2]
    # A plain run of 4 tokens never adds up to an hour: the bound stops it.
    rows = bench(target, ngram, prompts, BenchPlan(max_tokens=4, repeats=2, min_seconds=3600.0))
    assert [r.repeats for r in rows] == [2 * MAX_REPEAT_FACTOR]
    assert rows[0].tokens == 2 * MAX_REPEAT_FACTOR * 4


def test_doctor_refresh_measures_the_model_again(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.control import calibrate, hardware
    from localspec.store import calibration_file
    from localspec.testing.gguf_writer import Spec, write_gguf

    # A tiny model: the cache and --refresh are the same for any GGUF, and it is timed twice.
    # The machine's own probe (seconds of bandwidth timing) is the doctor test's above.
    model = str(write_gguf(Spec("llama"), tmp_path / "tiny.gguf"))
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda cores: 10.0)
    monkeypatch.setattr(hardware, "measure_gflops", lambda: 100.0)
    # The curve is cached per thread count, and the default count follows the machine's load,
    # which moves while the rest of the suite runs beside this test.
    pinned = ["doctor", "--json", "--threads", "1", "-m", model]
    assert main(pinned) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["model"] == "tiny.gguf"
    measured: list[object] = []
    real_measure = calibrate.measure
    monkeypatch.setattr(calibrate, "measure", lambda *args: measured.append(args) or real_measure(*args))
    assert main(pinned) == 0
    assert not measured  # cached
    capsys.readouterr()
    assert main([*pinned, "--refresh"]) == 0
    assert len(measured) == 1
    assert len(json.loads(capsys.readouterr().out)["verify_ms"]) == len(first["verify_ms"])
    # The llama.cpp build is part of what the curve is cached under.
    assert any("|build=" in key for key in json.loads(calibration_file().read_text()))
