#!/bin/bash
# Compiles ggml-cuda, llama.cpp's CUDA backend (its 145 nvcc compiles are about 4 of the 5 minutes a fresh
# GPU machine spends building), here on a machine without a GPU, into bench/gpu/carry/ggml-cuda.a.xz with
# ggml-cuda.a.id (the engines/llama/llama.mk build id it was compiled for). bench/gpu/run.sh links it
# instead of compiling it (make LLAMA_CUDA_PREBUILT=...) while the build id matches, and compiles it there
# if the engine does not link or llama.cpp's prefill does not run with it.
#   bash bench/gpu/prebuild_cuda.sh         (about 16 minutes on 2 cores; first run: 470 MB of wheels)
# The compiler is nvcc 13.0 from PyPI, the lent machines' toolkit (driver 580, CUDA 13.0): their own
# libcudart and libcublas are linked to it there. Run from the repository root, after `make -C engines all`
# (it reuses the fetched sdist); run it again whenever engines/llama/patches changes.
set -euo pipefail
CACHE=${SERVEPROTO_CACHE:-$HOME/.cache/serveproto}
CU=$CACHE/cuda-pip-13.0
W=$CU/nvidia/cu13
TK=$CU/toolkit
PY=${PY:-.venv/bin/python}
OUT=bench/gpu/carry
if [ ! -x "$W/bin/nvcc" ] || [ ! -x "$W/nvvm/bin/cicc" ]; then
  # one install: a second --target install into the same folder replaces the first one's nvidia/
  "$PY" -m pip install -q --no-deps --target "$CU" nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 \
    nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14
fi
# What nvcc and CMake's FindCUDAToolkit look for in a toolkit: lib64 beside nvcc's bin, the unversioned
# libraries, and libcuda (the driver's, absent here) as a stub with no symbols; ggml-cuda itself links none
ln -sfn lib "$W/lib64"
rm -rf "$TK" && mkdir -p "$TK/lib64/stubs"
for d in bin include nvvm; do ln -s "$W/$d" "$TK/$d"; done
ln -s lib64 "$TK/lib"
for f in "$W"/lib/*; do ln -s "$f" "$TK/lib64/"; done
for l in cudart cublas cublasLt; do ln -s "$W/lib/lib$l.so.13" "$TK/lib64/lib$l.so"; done
cc -shared -o "$TK/lib64/stubs/libcuda.so" -x c /dev/null

ID=$(make -s -C engines llama-build-id CUDA=1)
read -r -a FLAGS <<< "$(make -s -C engines llama-cmake-flags CUDA=1)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make -s -C engines llama-src DEST="$tmp/src"
cmake -S "$tmp/src" -B "$tmp/build" -G Ninja "${FLAGS[@]}" -DCMAKE_CUDA_COMPILER="$TK/bin/nvcc" \
  -DCUDAToolkit_ROOT="$TK" > "$tmp/configure.log" || { tail -30 "$tmp/configure.log"; exit 1; }
ninja -C "$tmp/build" -j"$(nproc)" ggml-cuda
mkdir -p $OUT
xz -T0 -6 -c "$tmp/build/ggml/src/ggml-cuda/libggml-cuda.a" > $OUT/ggml-cuda.a.xz.part
mv $OUT/ggml-cuda.a.xz.part $OUT/ggml-cuda.a.xz
echo "$ID" > $OUT/ggml-cuda.a.id
du -sh $OUT/ggml-cuda.a.xz
echo "ggml-cuda for build id $ID"
