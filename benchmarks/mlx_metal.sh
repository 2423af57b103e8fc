#!/usr/bin/env bash
# Metal figures for the MLX backend. Run on an Apple Silicon Mac from the repository root:
#
#   pip install -e '.[mlx,dev]' && benchmarks/mlx_metal.sh [OUT_DIR]
#
# Downloads two mlx-community models (about 4.5 GB, once, into the Hugging Face cache), then
# writes one JSON file per run to OUT_DIR (default benchmarks/results-mlx) and mlx-lm's own
# speculative decoding on the same pair to mlx_lm_peer.txt, for comparison.
set -euo pipefail
out=${1:-benchmarks/results-mlx}
mkdir -p "$out"
[[ "$(uname -s)/$(uname -m)" == "Darwin/arm64" ]] || echo "warning: not an Apple Silicon Mac; these are not Metal figures" >&2

fetch() { python -c "from huggingface_hub import snapshot_download as s; print(s('$1'))"; }
target=$(fetch mlx-community/Qwen2.5-7B-Instruct-4bit)
draft=$(fetch mlx-community/Qwen2.5-0.5B-Instruct-4bit)
run() { echo "+ localspec bench --backend mlx $*" >&2; localspec bench --backend mlx "$@"; }

# The pair mlx-lm's own reports use (M3 Pro: 1.83x): n-gram and the 0.5B drafter, adaptive draft length.
run --model "$target" --draft-model "$draft" -s ngram -s draft -r 2 --json >"$out/qwen7b_greedy.json"
run --model "$target" --draft-model "$draft" -s ngram -s draft -t 0.8 -r 3 --json >"$out/qwen7b_t08.json"
# Fixed draft length 3 (mlx-lm's default), to compare like for like with the peer below.
run --model "$target" --draft-model "$draft" -s draft --draft-tokens 3 -r 2 --json >"$out/qwen7b_draft3.json"
# In-memory self-drafting from the target alone (needs the api.py/bench.py hook for MLX self-drafters).
run --model "$target" -s qspec:2 -s layerskip -r 2 --json >"$out/qwen7b_selfdraft.json" ||
    echo "self-drafting runs skipped: this localspec does not route qspec/layerskip to the MLX backend yet" >&2
# The embedded default (SmolLM2-135M Q4_1 GGUF, read by MLX with its weights kept quantized).
run -s ngram -r 2 --json >"$out/smollm2_gguf.json"

# mlx-lm's own speculative loop on the same pair and the chat prompt of the suite, greedy and sampled.
prompt="Explain in three short paragraphs why the sky is blue, for a curious ten-year-old."
{
    for temp in 0.0 0.8; do
        echo "## mlx_lm.generate --temp $temp (plain, then draft model with 3 draft tokens)"
        mlx_lm.generate --model "$target" --prompt "$prompt" -m 160 --temp "$temp"
        mlx_lm.generate --model "$target" --draft-model "$draft" --num-draft-tokens 3 --prompt "$prompt" -m 160 --temp "$temp"
    done
} >"$out/mlx_lm_peer.txt" 2>&1
# This year's models: Qwen3.6's MTP head and Gemma 4's assistant (pulls about 60 GB once).
if localspec pull qwen3.6-27b --backend mlx && localspec pull gemma-4-12b-assistant --backend mlx; then
    python benchmarks/mlx_metal.py --pairs >"$out/mtp.md"
else
    echo "MTP runs skipped: the pairs could not be pulled" >&2
fi
echo "results in $out; summarize with: python benchmarks/summarize.py $out" >&2
