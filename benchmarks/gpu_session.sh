#!/usr/bin/env bash
# Issue #40's llama.cpp-on-CUDA measurements in one command on a lent GPU machine (one NVIDIA
# GPU, no network), about 9 minutes on an H100 machine, the CUDA build 5 of them. Every figure
# is printed beside llama.cpp's own program on the same file, as a ratio. docs/gpu.md explains.
#
# Here first, from the project's root (no GPU needed):
#     bash ../shared/gpu/prepare.sh && echo /.gpu/ >> .git/info/exclude
# then on the GPU machine with .gpu carried along:  bash benchmarks/gpu_session.sh
# $OUT (the run tool's folder that comes back) keeps the logs and JSON reports.
set -uo pipefail
root=$PWD; G=$root/.gpu; OUT=${OUT:-/tmp/gpu-session}; M=/tmp/m; B=/tmp/b
mkdir -p "$OUT" "$M"
t0=$(date +%s)
say() { echo "== $(( $(date +%s) - t0 )) s: $*"; }
[ -d "$G/src" ] || { echo "no .gpu/src: run ../shared/gpu/prepare.sh here first and carry .gpu"; exit 2; }

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$G"/whl/*.whl || exit 3
[ -e localspec/backends ] || ln -s ../backends localspec/backends   # what the editable install maps
export PYTHONPATH=/tmp/site:$G/pylib:$root PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$G/pylib/llama_cpp/lib
export LOCALSPEC_HOME=/tmp/lshome
nvidia-smi -L

# 1. llama.cpp with CUDA from llama-cpp-python's vendored source (a warm machine keeps /tmp/b).
if [ ! -x $B/bin/llama-lookup ]; then
  say "building llama.cpp with CUDA"
  cmake -S "$G/src" -B $B -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.txt" 2>&1 || { tail -40 "$OUT/cmake.txt"; exit 1; }
  timeout 400 cmake --build $B -j "$(nproc)" --target llama llama-bench llama-lookup llama-speculative-simple mtmd \
    >"$OUT/build.txt" 2>&1 || { tail -25 "$OUT/build.txt"; say "build failed or cut"; exit 1; }
fi
find $B -name "*.so*" -exec cp -a {} "$G/pylib/llama_cpp/lib/" \;   # the carried folder is laid anew each call
python3 -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"

# 2. Random weights at real shapes, written straight at Q4_K_M (speed does not depend on the values).
say "writing the 3B and 1B shapes at Q4_K_M"
python3 benchmarks/real_sizes.py --write-only --direct --only 3b --only 1b --models $M --out "$OUT/shapes" \
  >"$OUT/write.txt" 2>&1 || { tail -20 "$OUT/write.txt"; exit 1; }
T=$(ls $M/*3B*Q4_K_M.gguf) D=$(ls $M/*1B*Q4_K_M.gguf)

# 3. The load crash: llama.cpp's defaults, then localspec's settings one at a time, each in a process.
say "the load, variant by variant"
timeout 200 python3 benchmarks/gpu_load_bisect.py "$T" | tee "$OUT/load_bisect.txt"
LAYERS=()
if ! grep -q "automatic GPU layers  *ok" "$OUT/load_bisect.txt"; then
  LAYERS=(--gpu-layers 99)   # measure what does load, so the session still brings figures back
  grep -q "gpu_layers=0  *ok" "$OUT/load_bisect.txt" || { say "localspec cannot load here: see load_bisect.txt"; exit 4; }
fi

# 4. Plain vs llama-bench, n-gram vs llama-lookup, draft vs llama-speculative-simple (their
#    defaults offload every layer, as localspec's automatic layers do), on the bench suite.
say "plain, n-gram and draft against llama.cpp's programs"
timeout 150 python3 -m localspec bench --model "$T" --draft-model "$D" -s ngram -s draft "${LAYERS[@]}" \
  --peers --peers-bin $B/bin -n 128 -r 2 --json >"$OUT/bench_3b.json" 2>"$OUT/bench_3b.err"
python3 -c "import json,sys; print('\n'.join(json.load(open(sys.argv[1]))['summary']))" "$OUT/bench_3b.json" \
  || tail -20 "$OUT/bench_3b.err"

# 5. The controller on this cheap-block curve: the curve doctor measures on the GPU, the golden
#    replays' recorded answers priced on it (n-gram), and a draft model at constant acceptance
#    beside the best fixed γ (must be within 3 % and never below plain).
say "the cost curve and the controller on it"
[ ${#LAYERS[@]} -eq 0 ] || { say "doctor loads with the automatic layers, which crashed: no curve"; exit 5; }
timeout 120 python3 -m localspec doctor --model "$T" --refresh --json >"$OUT/doctor_3b.json" 2>"$OUT/doctor.err" \
  || { tail -5 "$OUT/doctor.err"; exit 6; }
timeout 60 python3 -m localspec doctor --model "$D" --json >"$OUT/doctor_1b.json" 2>>"$OUT/doctor.err" || exit 6
timeout 60 python3 benchmarks/replay_rules.py --doctor "$OUT/doctor_3b.json" --today
python3 - "$OUT/doctor_3b.json" "$OUT/doctor_1b.json" <<'PY'
import json, sys
from localspec.control.replay import projection_rows
target = [t / 1e3 for t in json.load(open(sys.argv[1]))["verify_ms"]]
draft = json.load(open(sys.argv[2]))["verify_ms"][0] / 1e3
print("t(k)/t(1):", " ".join(f"{t / target[0]:.2f}" for t in target[1:]))
for alpha, best, speed, chosen, reached in projection_rows(target, draft, (0.6, 0.7, 0.8)):
    print(f"3B <- 1B at {alpha}: best fixed γ={best} {speed:.2f}x, controller γ={chosen} {reached:.2f}x ({reached / speed:.0%})")
PY

# 6. serve's lanes on the device: --parallel 4 against --parallel 1 (side requests while a stream
#    runs, 1/2/4 clients, answers alone against 4 at once), the passes sized by the device check.
say "serve --parallel on the device"
timeout 240 python3 benchmarks/gpu_lanes.py --model "$T" --stream-tokens 300 | tee "$OUT/gpu_lanes.md"
say "done"
