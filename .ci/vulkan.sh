#!/usr/bin/env bash
# The GPU path without a GPU: llama-cpp-python built with llama.cpp's Vulkan backend, run on
# Mesa's software Vulkan device (lavapipe), with every layer and the output layer offloaded.
# Run it before touching GPU code (backends/llamacpp/gpu.py, greedy.py, --gpu-layers, a
# drafter's device). It is not part of .ci/run: the build alone takes longer than CI's budget
# (the figures are in docs/gpu.md). Idempotent: packages, wheel and venv are made once and reused.
#
#   bash .ci/vulkan.sh                      # the GPU-path test files on the software device
#   bash .ci/vulkan.sh -x -k ngram          # pytest options: still those files
#   bash .ci/vulkan.sh tests/test_x.py -k y # other test files instead
#
# Needs: Debian/Ubuntu with apt (as root) or the packages below already there; Mesa >= 25
# (Debian 12's 22.3.6 crashes inside lavapipe, docs/gpu.md); Vulkan headers >= 1.3.272 or the
# project's compatibility header (.ci/vulkan/include, used by itself on older headers).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.3.36  # pyproject's llama-cpp-python pin
CACHE="${LOCALSPEC_VULKAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localspec-ci/vulkan}"
export CMAKE_ARGS="-DGGML_VULKAN=on -DGGML_RPC=on"
DEFAULT_TESTS=(
    tests/backends/llamacpp/test_llamacpp_gpu.py            # the device found, every layer on it, doctor's line
    tests/backends/llamacpp/test_llamacpp_device_greedy.py  # the graph's argmax against the host's
    tests/backends/llamacpp/test_llamacpp_device_check.py   # bit_exact checked on the device, block size by block size
    tests/specification/test_llamacpp_rollback.py       # rollback on the device's KV cache
    tests/backends/llamacpp/test_llamacpp_hybrid.py         # hybrid (recurrent) targets
    tests/backends/llamacpp/test_llamacpp_mtp.py            # MTP heads
    tests/backends/llamacpp/test_llamacpp_eagle3.py         # EAGLE-3 heads
    tests/backends/llamacpp/test_llamacpp_dflash.py         # DFlash
    tests/server/test_batching_heads.py                     # lanes drafting with heads on the device (about 7 minutes)
)
# Greedy identity (n-gram, draft models on the device and the hybrid source, every draft length,
# against none on the device) on one prompt: the file's 40 cases take hours on lavapipe.
IDENTITY=(tests/specification/test_llamacpp_greedy.py -k code_edit)

packages() {
    local need=() mesa
    mesa=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
    dpkg --compare-versions "${mesa:-0}" ge 25 || need+=(mesa-vulkan-drivers)
    for p in libvulkan-dev glslc spirv-headers; do
        [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == *"ok installed" ]] || need+=("$p")
    done
    [ ${#need[@]} -eq 0 ] && return 0
    if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
        echo "install ${need[*]} (Mesa >= 25) as root, then run this again" >&2
        exit 2
    fi
    local target=()
    if grep -q '^VERSION_CODENAME=bookworm' /etc/os-release; then
        # Debian 12's Mesa is 22.3.6; bookworm-backports has 25.0.
        if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
            printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
                >/etc/apt/sources.list.d/bookworm-backports.sources
        fi
        target=(-t bookworm-backports)
    fi
    echo "== packages: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${target[@]}" "${need[@]}" >/dev/null
    mesa=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers)
    dpkg --compare-versions "$mesa" ge 25 || { echo "Mesa $mesa is older than 25: lavapipe crashes (docs/gpu.md)" >&2; exit 2; }
}

wheel_key() {
    # One wheel per llama-cpp-python version, build flags, compatibility header and CPU kind
    # (llama.cpp's CPU kernels are built for the host: -march=native).
    {
        echo "$VERSION $CMAKE_ARGS"
        cat .ci/vulkan/include/vulkan/vulkan.hpp
        # awk reads gcc's whole answer: grep -m1 would close the pipe on it (pipefail: gcc's status 2)
        gcc -march=native -Q --help=target 2>/dev/null | awk '$1 == "-march=" {print $2}'
    } | sha1sum | cut -c1-12
}

build_wheel() {
    local wheels=$1
    ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1 && return 0
    local headers
    headers=$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' /usr/include/vulkan/vulkan_core.h)
    if [ "${headers:-0}" -lt 272 ]; then
        # VK_EXT_layer_settings' types, which ggml-vulkan.cpp names, came in Vulkan-Headers 1.3.272.
        export CPLUS_INCLUDE_PATH="$PWD/.ci/vulkan/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
    fi
    echo "== building llama-cpp-python $VERSION with Vulkan (Vulkan headers 1.3.$headers; once per key)"
    rm -rf "$wheels.partial"
    # --no-cache-dir: a Vulkan wheel in pip's cache would be what .ci/run's CPU venv installs next.
    local started=$SECONDS
    nice "$VENV/bin/pip" wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
        -w "$wheels.partial" "llama-cpp-python==$VERSION"
    mv "$wheels.partial" "$wheels"
    echo "   built in $((SECONDS - started)) s"
}

venv() {
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip
    # tokenizers: the tests' GGUF writer; torch and mlx stay out (their tests skip).
    PIP_NO_COMPILE=0 "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[dev]' 'tokenizers>=0.20'
}

install_wheel() {
    local wheels=$1 stamp="$VENV/.localspec-vulkan-wheel"
    [ "$(cat "$stamp" 2>/dev/null)" = "$wheels" ] && return 0
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$wheels"/llama_cpp_python-*.whl
    "$VENV/bin/pip" install -q --disable-pip-version-check "$wheels"/llama_cpp_python-*.whl  # its dependencies
    echo "$wheels" >"$stamp"
}

packages
mkdir -p "$CACHE"
VENV="$CACHE/venv"
venv
WHEELS="$CACHE/wheels-$(wheel_key)"
build_wheel "$WHEELS"
install_wheel "$WHEELS"

# ggml's Vulkan backend skips CPU-type devices unless told their index; lavapipe is device 0
# where it is the only Vulkan driver.
export GGML_VK_VISIBLE_DEVICES="${GGML_VK_VISIBLE_DEVICES:-0}"
export OMP_WAIT_POLICY=PASSIVE
echo "== the device"
"$VENV/bin/python" - <<'EOF'
import sys
from localspec.backends.llamacpp.gpu import gpu_backends, gpu_device

device = gpu_device()
print(f"backends {gpu_backends()}, device {device}")
sys.exit(0 if device else "no Vulkan device seen: is mesa-vulkan-drivers installed and GGML_VK_VISIBLE_DEVICES right?")
EOF
echo "== tests on the software device"
pytest() { "$VENV/bin/python" -m pytest -p no:cacheprovider -q "$@"; }
named=0  # pytest options alone (-x, -rs) still run the default files, never the whole suite
for arg in "$@"; do case $arg in tests/* | *.py | *.py::*) named=1 ;; esac; done
if [ $named = 1 ]; then
    pytest "$@"
else
    # Both parts run whatever the first gives: a failure there must not hide the identity cases.
    status=0
    pytest "$@" "${DEFAULT_TESTS[@]}" || status=$?
    pytest "$@" "${IDENTITY[@]}" || status=$?
    exit $status
fi
