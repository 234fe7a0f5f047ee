#!/bin/bash
# bench/load.py on the GPU machine, as one of bench/gpu/run.sh's BENCHES (run.sh has built the engine
# and written $MODEL by then):
#   BENCHES='extra load bash bench/gpu/load.sh --model $MODEL --clients 1,8,32,64 --seconds 5' EXTRAS=0 bash bench/gpu/run.sh
# Before bench/load.py it builds what bench/gpu/prepare.sh carried, once per machine (a warm one keeps it):
#   - llama-server with the CUDA backend from carry/llama-full.tgz (`make -C engines llama-server CUDA=1
#     LLAMA_FULL=...`, stock llama.cpp without flash-attention kernels); without that file bench/load.py
#     runs with --no-llama-server;
#   - the baseline tree from carry/baseline.tgz (`BASELINE=<commit> bench/gpu/prepare.sh`) in /tmp/load-baseline-*,
#     built from the carried llama.cpp source; its llama.mk names its own build directory (since main's
#     7cd8b60 a build is named after the patches and the CMake flags), so a baseline from before that
#     builds llama.cpp again, about 4 minutes with CUDA; bench/load.py gets --baseline-tree that folder.
# LOAD_BUILD_ONLY=1 builds and stops: a first call on a fresh machine, where run.sh's own build leaves
# too little of the call's time for the run. The arguments go to bench/load.py; its cells also land in
# /tmp/gpu-res/load.json (run.sh's results.tar).
set -u
C=${CARRY:-bench/gpu/carry}
CUDA=${CUDA:-1}
LLAMA_SRC=${LLAMA_SRC:-/tmp/llama-src}
JOBS=${JOBS:-16}
extra=()
t0=$(date +%s)
if [ -f $C/llama-full.tgz ]; then
  FULL=/tmp/llama-full
  [ -f $FULL/tools/server/CMakeLists.txt ] || { mkdir -p $FULL && tar -xzf $C/llama-full.tgz -C $FULL; }
  make -C engines llama-server CUDA=$CUDA LLAMA_JOBS=$JOBS LLAMA_FULL=$FULL > /tmp/llama-server-build.log 2>&1 \
    || { tail -30 /tmp/llama-server-build.log; echo "llama-server: build failed"; exit 1; }
  echo "llama-server: built ($(( $(date +%s) - t0 )) s): $(ldd engines/bin/llama-server | grep -c -E 'cuda|cublas') CUDA libraries linked"
else
  echo "llama-server: $C/llama-full.tgz not carried, bench/load.py runs without it"
  extra+=(--no-llama-server)
fi
if [ -f $C/baseline.tgz ]; then
  # named after the archive: a warm machine that holds another baseline does not serve it instead
  B=/tmp/load-baseline-$(sha256sum $C/baseline.tgz | cut -c1-10)
  [ -f $B/Makefile ] || { mkdir -p $B && tar -xzf $C/baseline.tgz -C $B; }
  make -C $B/engines all CUDA=$CUDA LLAMA_JOBS=$JOBS LLAMA_SRC=$LLAMA_SRC > /tmp/load-baseline-build.log 2>&1 \
    || { tail -30 /tmp/load-baseline-build.log; echo "baseline: build failed"; exit 1; }
  echo "baseline: built ($(( $(date +%s) - t0 )) s)"
  extra+=(--baseline-tree $B)
fi
[ "${LOAD_BUILD_ONLY:-0}" = 1 ] && exit 0
json=()
[ -d /tmp/gpu-res ] && json=(--json /tmp/gpu-res/load.json)
# "$@" last: load.py's --engine takes the rest of the line
exec python3 -m bench.load "${extra[@]}" "${json[@]}" "$@"
