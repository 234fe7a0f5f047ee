#!/bin/bash
# Compiles, on a machine without a GPU, each CUDA source our llama.cpp patches touch (engines/llama/patches),
# with nvcc from PyPI (nvidia-cuda-nvcc and its headers, CUDA 13 like the lent machines), for sm_90: a patch
# that does not compile is found here, not after a device call's 300-s build. Objects are thrown away.
#   bash bench/gpu/nvcc_check.sh            (first run: about 1 GB of wheels into $SERVEPROTO_CACHE/cuda-pip)
# Run from the repository root, after `make -C engines all` (it reuses the fetched sdist).
set -euo pipefail
CACHE=${SERVEPROTO_CACHE:-$HOME/.cache/serveproto}
CUDA=$CACHE/cuda-pip
NVCC=$CUDA/nvidia/cu13/bin/nvcc
PY=${PY:-python3}
if [ ! -x "$NVCC" ]; then
  "$PY" -m pip install -q --target "$CUDA" nvidia-cuda-nvcc nvidia-cuda-crt nvidia-cuda-runtime nvidia-cuda-cccl \
    nvidia-cublas
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make -s -C engines llama-src DEST="$tmp/src"
INC=$CUDA/nvidia/cu13/include
# the .cu files the patches touch, and for a touched header (.cuh) the .cu of the same name, where there is one
files=$(sed -n 's|^+++ b/\(ggml/src/ggml-cuda/[^[:space:]]*\.cuh\{0,1\}\)\([[:space:]].*\)\{0,1\}$|\1|p' \
  engines/llama/patches/*/*.patch | sed 's|\.cuh$|.cu|' | sort -u)
# ggml-cuda's CMake flags (ggml/src/ggml-cuda/CMakeLists.txt, ggml/cmake/common.cmake): flash attention's
# vector kernels for F16 K and V only, the default
defs="-DGGML_CUDA_USE_GRAPHS -DGGML_USE_CUDA -DGGML_SCHED_MAX_COPIES=4 -DGGML_CUDA_FA_QUANTS=\"f16-f16\""
for k in q4_0 q4_1 q5_0 q5_1 q8_0 bf16 f16; do
  for v in q4_0 q4_1 q5_0 q5_1 q8_0 bf16 f16; do
    defs="$defs -DGGML_CUDA_FA_${k^^}_${v^^}=$([ "$k-$v" = f16-f16 ] && echo 1 || echo 0)"
  done
done
rc=0
for f in $files; do
  [ -f "$tmp/src/$f" ] || continue
  t0=$(date +%s)
  # shellcheck disable=SC2086
  if (cd "$tmp/src" && "$NVCC" -std=c++17 -arch=sm_90 -O1 -use_fast_math -extended-lambda $defs \
        -I ggml/include -I ggml/src -I ggml/src/ggml-cuda -I "$INC" -I "$INC/cccl" -c "$f" -o "$tmp/out.o" \
        > "$tmp/log" 2>&1); then
    echo "nvcc_check: $f compiles ($(( $(date +%s) - t0 )) s)"
  else
    echo "nvcc_check: $f FAILS:"
    grep -m 10 -E "error|Error" "$tmp/log" | cut -c1-300
    rc=1
  fi
done
exit $rc
