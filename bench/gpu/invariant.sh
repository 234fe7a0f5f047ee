#!/bin/bash
# Issue 29, as one of bench/gpu/run.sh's BENCHES (run.sh has built the CUDA engine and written $MODEL,
# the random 8B in Q4_K):
#   BENCHES='extra invariant bash bench/gpu/invariant.sh $MODEL' EXTRAS=0 bash bench/gpu/run.sh
#   1. the digits matrix (bench/digits.py) on the GPU with --numerics fast and invariant (and, when
#      invariant moves, again with the MMQ tile width pinned: GGML_CUDA_INVARIANT_MMQ_J=128);
#   2. the same model cut to 4 layers: the matrix on the GPU (invariant) and on this host's CPU
#      (CUDA_VISIBLE_DEVICES= hides the GPU: the CPU backend's invariant numerics of the same build),
#      and how far the GPU's read-out lies from the CPU's;
#   3. what invariant refuses: F16 weights (cuBLAS), a 4-layer F16 model;
#   4. the cost: bench/load.py at 32 clients (bench/gpu/ceiling.sh's load cells), fast against
#      invariant without the score cache (the kernels' price) and with it (the default); INV_LOADS
#      replaces those lines (GGML_CUDA_INVARIANT_SKIP=fa|mm|fusion prices one part of the switch);
#   5. (part gqa) the attention kernel with one query head a warp: the same bits as with several.
# INV_S seconds in all (pass run.sh's time left); INV_PARTS (default "digits small refuse load") picks;
# INV_AGAINST="--against FILE" compares the invariant read-out with an earlier call's dump.
set -u
Q4=$1
RES=${RES:-/tmp/gpu-res}
C=${CARRY:-bench/gpu/carry}
T0=$(date +%s)
BUDGET=${INV_S:-500}
PARTS=${INV_PARTS:-digits small refuse load}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
has() { [[ " $PARTS " == *" $1 "* ]]; }
Q4_4=/tmp/llama3-8b-random-4l.Q4_K.gguf
F16_4=/tmp/llama3-8b-random-4l.F16.gguf
if has small || has refuse; then
  ( python3 -m bench.gpu.make_model model --tokenizer $C/tokenizer.gguf --out $Q4_4 --type q4_k --layers 4 > $RES/model-4l.log 2>&1
    python3 -m bench.gpu.make_model model --tokenizer $C/tokenizer.gguf --out $F16_4 --type f16 --layers 4 >> $RES/model-4l.log 2>&1 ) &
  SMALL_PID=$!
fi
digits() {  # TAG [NAME=VALUE...] DIGITS_ARGS...
  local tag=$1; shift
  [ "$(left)" -gt 30 ] || { echo "== digits $tag: skipped, $(left) s left"; return; }
  echo "== digits $tag: $*"
  timeout $(( $(left) - 10 )) env "$@" --dump $RES/digits-$tag.json > $RES/digits-$tag.log 2>&1
  echo "digits $tag: exit $?"
  cat $RES/digits-$tag.log | tail -14
}
INV="--engine-arg=--numerics --engine-arg=invariant"
if has digits; then
  digits fast python3 -m bench.digits --model $Q4
  digits inv python3 -m bench.digits --model $Q4 $INV --against $RES/digits-fast.json ${INV_AGAINST:-}
  grep -q DIFFERENT $RES/digits-inv.log && digits inv-j128 GGML_CUDA_INVARIANT_MMQ_J=128 python3 -m bench.digits --model $Q4 $INV
fi
# the attention kernel with one query head a warp (GGML_CUDA_INVARIANT_FA_GQA=0): the same bits
has gqa && digits inv-g1 GGML_CUDA_INVARIANT_FA_GQA=0 python3 -m bench.digits --model $Q4 $INV --against $RES/digits-inv.json
if has small || has refuse; then
  wait $SMALL_PID
  tail -2 $RES/model-4l.log
fi
if has small; then
  digits cpu4 CUDA_VISIBLE_DEVICES= python3 -m bench.digits --model $Q4_4 --threads $(nproc)
  digits inv4 python3 -m bench.digits --model $Q4_4 $INV --against $RES/digits-cpu4.json
  digits fast4 python3 -m bench.digits --model $Q4_4 --against $RES/digits-cpu4.json --against $RES/digits-inv4.json
fi
if has refuse; then
  echo "== refuse: F16 weights under --numerics invariant"
  timeout 60 engines/bin/serveproto-llama --model $F16_4 --numerics invariant < /dev/null 2> $RES/refuse-f16.err | head -3
  echo "engine: exit ${PIPESTATUS[0]}; stderr: $(grep -c "" $RES/refuse-f16.err) lines, $(grep -m2 "batch-dependent" $RES/refuse-f16.err)"
fi
if has load; then
  # INV_LOADS: other load lines (ceiling.sh's LOADS), e.g. GGML_CUDA_INVARIANT_SKIP=fa to price a part
  LOADS=${INV_LOADS:-"fast q4 --numerics fast
inv-nocache q4 --numerics invariant --score-cache-mb 0
inv q4 --numerics invariant"} CEILING_S=$(left) RES=$RES bash bench/gpu/ceiling.sh $Q4
fi
echo "invariant.sh: $(( $(date +%s) - T0 )) s"
