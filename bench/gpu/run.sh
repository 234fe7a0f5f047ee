#!/bin/bash
# The GPU run of issue 8, in one command on the lent NVIDIA H200 (no network there):
#   1. install the carried wheels (bench/gpu/carry/whl) into /tmp/site;
#   2. build the engine and llama-prefill-ref with the CUDA backend from the carried llama.cpp
#      subset (`make -C engines all CUDA=1 LLAMA_SRC=...`; about 4 minutes with 16 cores; a warm
#      machine that already built them skips this);
#   3. meanwhile write the random-weight Llama-3-8B-geometry GGUF (bench/gpu/make_model.py);
#   4. run bench/gpu_decisions.py with the engine's defaults, then, time allowing, System One
#      again with --flash-attn --kv-type f16, bench/decisions.py's fixture part and
#      bench/gpu/fixed_cost.py; results in $OUT/results.tar and the output's tail.
# Run from the repository root with carry=["bench/gpu/carry"]:  bash bench/gpu/run.sh
# (PEER_BUILD=1 also builds, meanwhile, what bench/gpu/load.sh needs: llama-server, a baseline tree.)
# Budget: BUDGET_S seconds in all (default 570), so the call ends inside the 600 s limit.
set -u
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
OUT=${OUT:-/tmp/gpu-out}
C=${CARRY:-bench/gpu/carry}
RES=/tmp/gpu-res
MODEL=/tmp/llama3-8b-random.Q4_K.gguf
rm -rf $RES  # a warm machine keeps the last call's logs: none of them count for this one
mkdir -p "$OUT" $RES
elapsed() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(elapsed) s] $*" | tee -a $RES/run.log; }
finish() {
  cp -f $RES/run.log "$OUT/run.log" 2>/dev/null
  tar -cf "$OUT/results.tar" -C $RES . 2>/dev/null
  log "done"
}
trap finish EXIT

log "$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader) | $(nproc) cores | $(python3 --version)"
if [ "${SITE_INSTALL:-1}" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $C/whl/*.whl \
    || { log "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
export SERVEPROTO_CACHE=${SERVEPROTO_CACHE:-/tmp/sp-cache}
python3 -c "import gateway.server.app, gateway.engine, serveproto, fixtures.sync_engine, gguf, orjson, zstandard" \
  || { log "python imports failed"; exit 1; }

( python3 -m bench.gpu.make_model model --tokenizer $C/tokenizer.gguf --out $MODEL --type q4_k ${MODEL_ARGS:-} > $RES/model.log 2>&1
  echo $? > /tmp/model.rc ) &
MODEL_PID=$!
# F16_EARLY=1: the F16 model too (bench/gpu/ceiling.sh waits for it), beside the build rather than after it
if [ "${F16_EARLY:-0}" = 1 ]; then
  ( python3 -m bench.gpu.make_model model --tokenizer $C/tokenizer.gguf --out /tmp/llama3-8b-random.F16.gguf.part \
      --type f16 > $RES/model-f16.log 2>&1 && mv /tmp/llama3-8b-random.F16.gguf.part /tmp/llama3-8b-random.F16.gguf ) &
fi

# make decides what is out of date (on a warm machine that already built: nothing)
CUDA=${CUDA:-1}
if [ -z "${LLAMA_SRC:-}" ]; then
  LLAMA_SRC=/tmp/llama-src
  [ -f $LLAMA_SRC/CMakeLists.txt ] || { mkdir -p $LLAMA_SRC && tar -xzf $C/llama-src.tgz -C $LLAMA_SRC; }
fi
MK="make -C engines CUDA=$CUDA LLAMA_JOBS=${JOBS:-16} LLAMA_SRC=$LLAMA_SRC"
# PEER_BUILD=1: bench/gpu/load.sh's builds (llama-server, the baseline tree) alongside the engine's,
# within the call's budget (cut short, they resume in the next call while the machine is warm)
if [ "${PEER_BUILD:-0}" = 1 ]; then
  ( LOAD_BUILD_ONLY=1 CUDA=$CUDA LLAMA_SRC=$LLAMA_SRC timeout $(( BUDGET_S - $(elapsed) - 20 )) \
      bash bench/gpu/load.sh > $RES/load-build.log 2>&1
    echo $? > /tmp/load-build.rc ) &
  PEER_PID=$!
fi
# A ggml-cuda compiled on a machine without a GPU for this build id (bench/gpu/prebuild_cuda.sh: carry/
# ggml-cuda.a.xz and .id) is linked instead of compiled (PREBUILT_CUDA=0 compiles it anyway); should the
# engine not link or llama.cpp's prefill not run with it, the build starts again without it.
PREBUILT=""
if [ "$CUDA" = 1 ] && [ "${PREBUILT_CUDA:-1}" = 1 ] && [ -f $C/ggml-cuda.a.xz ]; then
  if [ "$(cat $C/ggml-cuda.a.id)" = "$($MK -s llama-build-id)" ]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      $C/ggml-cuda.a.xz /tmp/ggml-cuda.a && cp $C/ggml-cuda.a.id /tmp/ggml-cuda.a.id \
      && PREBUILT="LLAMA_CUDA_PREBUILT=/tmp/ggml-cuda.a"
  else
    log "the carried ggml-cuda is for build id $(cat $C/ggml-cuda.a.id), not this one: compiling it here"
  fi
fi
build() {  # [LLAMA_CUDA_PREBUILT=FILE]
  $MK "$@" llama-libs > $RES/build.log 2>&1 || { tail -40 $RES/build.log; log "llama.cpp build failed"; return 1; }
  log "llama.cpp built (CUDA=$CUDA${1:+, $1})"
  # engines/llama/llama.mk links llama, ggml (the backend registry), ggml-cuda, ggml-cpu, ggml-base
  # (and builds without NCCL since 2fbb9ee); should the link fail, the line that linked on the H200
  # on 2026-11-30 (before that commit): one archive group, NCCL when CMake found it.
  if ! $MK all >> $RES/build.log 2>&1; then
    # the build directory is named after engines/llama/patches (engines/llama/llama.mk)
    B=$(ls -d $SERVEPROTO_CACHE/llama.cpp/0.3.36/build-$([ "$CUDA" = 1 ] && echo cuda || echo cpu)-* | head -1)
    NCCL=$(sed -n 's/^NCCL_LIBRARY[^=]*=//p' $B/CMakeCache.txt | head -1)
    NCCL_LINK=""
    [ -f "$NCCL" ] && NCCL_LINK="$NCCL -Wl,-rpath,$(dirname "$NCCL")"
    CUH=${CUDA_HOME:-/usr/local/cuda}
    LDLIBS="-Wl,--start-group $B/src/libllama.a $B/ggml/src/libggml.a $B/ggml/src/ggml-cuda/libggml-cuda.a \
$B/ggml/src/libggml-cpu.a $B/ggml/src/libggml-base.a -Wl,--end-group -L$CUH/lib64 -L$CUH/lib64/stubs -Wl,-rpath,$CUH/lib64 \
-lcudart -lcublas -lcublasLt -lcuda $NCCL_LINK -ldl -lrt -lstdc++ -lm -fopenmp -lpthread"
    log "the plain link failed; again with LLAMA_LDLIBS=$LDLIBS"
    $MK all LLAMA_LDLIBS="$LDLIBS" >> $RES/build.log 2>&1 || { tail -40 $RES/build.log; log "engine link failed"; return 1; }
  fi
  log "engines linked: $(ls -la engines/bin/serveproto-llama engines/bin/llama-prefill-ref | awk '{print $5, $9}' | tr '\n' ' ')"
}
unbuild() {  # forget a build made with the prebuilt ggml-cuda
  rm -rf $SERVEPROTO_CACHE/llama.cpp/0.3.36/build-cuda-* engines/bin/serveproto-llama engines/bin/llama-prefill-ref
  PREBUILT=""
}
if ! build $PREBUILT; then
  [ -n "$PREBUILT" ] || exit 1
  log "with the carried ggml-cuda it did not build: again, compiling it"
  unbuild
  build || exit 1
fi
ldd engines/bin/serveproto-llama | grep -E "not found|cuda|cublas|nccl" | tee -a $RES/run.log

wait $MODEL_PID
[ "$(cat /tmp/model.rc)" = 0 ] || { cat $RES/model.log; log "model generation failed"; exit 1; }
log "$(tail -1 $RES/model.log)"
if [ -n "$PREBUILT" ] && [ ! -f /tmp/smoke.ok ]; then
  # the carried kernels' first use (once a machine): llama.cpp's prefill of 512 tokens
  python3 -c "print('A short check of the carried kernels. ' * 100)" > /tmp/smoke.txt
  if timeout 120 engines/bin/llama-prefill-ref --model $MODEL --prompt-file /tmp/smoke.txt --ctx 1024 --reps 1 \
      --ubatch 512 --tokens 512 --modes f32 > $RES/smoke.log 2>&1; then
    log "the carried ggml-cuda runs: $(tail -1 $RES/smoke.log)"
    touch /tmp/smoke.ok
  else
    tail -20 $RES/smoke.log
    log "llama.cpp's prefill failed with the carried ggml-cuda: building again, compiling it"
    unbuild
    build || exit 1
  fi
fi
if [ -n "${PEER_PID:-}" ]; then
  wait $PEER_PID
  log "load.sh's builds: exit $(cat /tmp/load-build.rc); $(tail -3 $RES/load-build.log | tr '\n' ' ')"
fi

left() { echo $(( BUDGET_S - $(elapsed) )); }
# bench TAG ARGS...: runs within the time left (15 s kept for packing); the table at the end,
# or the rows printed so far when it was cut short.
bench() {
  local tag=$1; shift
  log "bench $tag: $*, $(left) s left"
  [ "$(left)" -gt 30 ] || return 1
  timeout $(( $(left) - 15 )) python3 -m bench.gpu_decisions --model $MODEL --out-dir $RES --tag "$tag" "$@" \
    ${BENCH_ARGS:-} > $RES/$tag.log 2>&1
  log "bench $tag: exit $?"
  grep -v "^|" $RES/$tag.log | tail -4
  cat $RES/$tag.md 2>/dev/null || grep "^|" $RES/$tag.log
}
# Extras (EXTRAS=0 skips them), each within the time left: the gateway's own share per request
# and a loopback load run on the fixture engine (bench/decisions.py, its fixture part only,
# on this host's quiet cores), then where the engine's fixed per-request cost goes.
extra() {
  local tag=$1; shift
  log "extra $tag: $*, $(left) s left"
  [ "$(left)" -gt 40 ] || return 1
  timeout $(( $(left) - 15 )) "$@" > $RES/$tag.log 2>&1
  log "extra $tag: exit $?"
  cat $RES/$tag.log | tail -25
}
if [ -n "${BENCHES:-}" ]; then
  # one command a line, instead of the two below: "[VAR=VALUE ...] bench TAG ARGS..." or
  # "extra TAG COMMAND..." (e.g. extra digits python3 -m bench.digits --model $MODEL, or
  # extra load bash bench/gpu/load.sh --model $MODEL --clients 1,8,32,64: bench/load.py, see load.sh)
  while IFS= read -r line; do
    [ -n "$line" ] && eval "$line"
  done <<< "$BENCHES"
else
  bench default
  [ "$(left)" -gt 90 ] && bench fa_f16 --only server "--engine-flags=--flash-attn --kv-type f16"
fi
# an engine that aborted (ggml_abort prints a backtrace of offsets): its functions, by addr2line
for f in $RES/*-server.log $RES/*-engine.log; do
  grep -o "serveproto-llama(+0x[0-9a-f]*)" "$f" 2>/dev/null | sed 's/.*(+\(0x[0-9a-f]*\))/\1/' | awk '!seen[$0]++' > /tmp/offsets || true
  [ -s /tmp/offsets ] || continue
  log "backtrace in $(basename "$f"):"
  addr2line -f -C -p -e engines/bin/serveproto-llama $(cat /tmp/offsets) 2>&1 | tee -a $RES/run.log
  grep -B3 -m3 -E "GGML_ASSERT|CUDA error|error:" "$f" | tail -12 | tee -a $RES/run.log
done

if [ "${EXTRAS:-1}" = 1 ]; then
  # the committed bench/decisions.py (prepare.sh), run from beside the working tree's copy
  D=bench.decisions
  [ -f $C/decisions.py ] && cp -f $C/decisions.py bench/_decisions_committed.py && D=bench._decisions_committed
  extra decisions_fixture python3 -m $D --skip-llm
  rm -f bench/_decisions_committed.py
  extra fixed_cost python3 -m bench.gpu.fixed_cost --model $MODEL --threads $(nproc)
fi
true
