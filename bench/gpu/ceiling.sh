#!/bin/bash
# Issue 24's ceiling and time split, as one of bench/gpu/run.sh's BENCHES (run.sh has built the engine and
# llama-prefill-ref and written $MODEL, the random 8B in Q4_K):
#   BENCHES='extra ceiling bash bench/gpu/ceiling.sh $MODEL' EXTRAS=0 bash bench/gpu/run.sh
#   1. the same random 8B written again in F16 (bench/gpu/make_model.py --type f16, meanwhile);
#   2. llama.cpp's own prefill of each (llama-prefill-ref: 512 and 2048 tokens, ubatch 512 and 2048,
#      F32/F16 KV with and without flash attention, best of 3);
#   3. bench/load.py at 32 clients (STEPS: the engine variants), the engine profiled (SERVEPROTO_PROFILE,
#      engines/llama/profile.c) and nvidia-smi dmon beside it; bench/gpu/profile_split.py's table per run.
# Each step runs within CEILING_S seconds in all (pass run.sh's time left). LOADS="TAG q4|f16 [NAME=VALUE...]
# FLAGS" lines instead run only those loads (the F16 model written meanwhile when one needs it; NAME=VALUE
# words set the engine's environment, e.g. SERVEPROTO_OVERLAP=0; DEBIAS=VALUE is bench/load.py's --debias
# instead, default none). CLIENTS=1,8,32,64 runs bench/load.py at those clients instead of 32 alone;
# REQUESTS=N: a cell starts at most N requests (default 1000: the document's cell then lasts about 2 s).
# Each load's server log (the engine's crashes among it, and a stalled engine's stack) is $RES/TAG-server.log.
set -u
Q4=$1
F16=/tmp/llama3-8b-random.F16.gguf
RES=${RES:-/tmp/gpu-res}
C=${CARRY:-bench/gpu/carry}
T0=$(date +%s)
BUDGET=${CEILING_S:-500}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# written under another name and renamed, so that a file at $F16 is whole; a generation already running
# (a call that started one before run.sh's build, the same way) is waited for, not repeated
F16_PID=
NEED_F16=1  # LOADS whose lines name no f16 model write none
[ -n "${LOADS:-}" ] && ! grep -q "^ *[^ ]* f16" <<< "$LOADS" && NEED_F16=0
if [ $NEED_F16 = 1 ] && [ ! -f $F16 ] && ! pgrep -f "make_model.py model .*--type f16" > /dev/null; then
  ( python3 -m bench.gpu.make_model model --tokenizer $C/tokenizer.gguf --out $F16.part --type f16 \
    > $RES/model-f16.log 2>&1 && mv $F16.part $F16; echo "F16 model: exit $? $(tail -1 $RES/model-f16.log)" ) &
  F16_PID=$!
fi
f16_ready() {
  [ -n "$F16_PID" ] && wait $F16_PID
  while [ ! -f $F16 ] && pgrep -f "make_model.py model .*--type f16" > /dev/null; do sleep 2; done
  [ -f $F16 ]
}
python3 -c "print('The quarterly report covers revenue, churn and support load across all regions. ' * 200)" > /tmp/prompt.txt

prefill() {  # MODEL LABEL
  for ub in 512 2048; do
    [ "$(left)" -gt 40 ] || return
    echo "== prefill $2, ubatch $ub"
    timeout $(( $(left) - 20 )) engines/bin/llama-prefill-ref --model $1 --prompt-file /tmp/prompt.txt \
      --ctx 4096 --reps 3 --ubatch $ub --tokens 512,2048 --modes f32,fa-f32,fa-f16
  done
}

load() {  # TAG MODEL [NAME=VALUE...] ENGINE_FLAGS...: the NAME=VALUE words go to the environment
  local tag=$1 model=$2; shift 2
  local envs=()
  while [ $# -gt 0 ] && [[ "$1" != -* && "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$(left)" -gt 60 ] || { echo "== load $tag: skipped, $(left) s left"; return; }
  local debias=none  # DEBIAS=VALUE among the words: load.py's --debias (e.g. 'canonical,content_free;none')
  for w in "${envs[@]}"; do [[ $w == DEBIAS=* ]] && debias=${w#DEBIAS=}; done
  echo "== load $tag: ${envs[*]} $*"
  rm -f /tmp/prof-$tag.*
  nvidia-smi dmon -s u -d 1 -o T > $RES/dmon-$tag.log 2>&1 &
  local dm=$!
  env "${envs[@]}" SERVEPROTO_PROFILE=/tmp/prof-$tag BENCH_SERVER_LOG=$RES/$tag-server.log timeout $(( $(left) - 15 )) python3 -m bench.load --no-llama-server \
    --model $model --workloads ${WORKLOADS:-document,tickets} --clients ${CLIENTS:-32} --seconds ${SECONDS_CELL:-5} --requests ${REQUESTS:-1000} \
    --debias "$debias" --json $RES/load-$tag.json --engine engines/bin/serveproto-llama --model $model "$@" \
    > $RES/load-$tag.log 2>&1
  echo "load $tag: exit $?"
  grep -m4 -E "crash|exited|killed|GGML_ASSERT|abort|stopping" $RES/$tag-server.log 2>/dev/null | cut -c1-400
  # a stalled engine's stack, which the gateway asks for (SIGUSR2) before the kill (spec/serve-protocol.md 9.3);
  # run.sh's addr2line pass at the end names its serveproto-llama(+0x...) frames
  sed -n '/: stack at a stall (/,/: end of stack$/p' $RES/$tag-server.log 2>/dev/null | head -140 | cut -c1-200
  # GGML_CUDA_GRAPH_STATS=N (patch 0012) and the late fill's exit line (SERVEPROTO_PIPELINE_LATE), when set
  grep -E "CUDA graphs:|late fill:" $RES/$tag-server.log 2>/dev/null | tail -2 | cut -c1-200
  kill $dm 2>/dev/null
  grep "^|" $RES/load-$tag.log | grep -v "^|---" | cut -d'|' -f2-8
  cp /tmp/prof-$tag.* $RES/ 2>/dev/null
  python3 -m bench.gpu.profile_split --tag "$tag" --dmon $RES/dmon-$tag.log /tmp/prof-$tag.* 2>&1
}

if [ -n "${LOADS:-}" ]; then
  # LOADS: one load a line, "TAG q4|f16 [ENGINE_FLAGS...]" (no prefill table): a later call's cells
  while read -r tag which flags; do
    [ -n "$tag" ] || continue
    m=$Q4
    if [ "$which" = f16 ]; then f16_ready || { echo "== load $tag: no F16 model"; continue; }; m=$F16; fi
    # shellcheck disable=SC2086
    load "$tag" "$m" $flags
  done <<< "$LOADS"
else
  prefill $Q4 "Q4_K"
  load q4 $Q4
  load q4-fa16 $Q4 --flash-attn --kv-type f16
  f16_ready
  [ -f $F16 ] && prefill $F16 "F16"
  [ -f $F16 ] && load f16-fa16 $F16 --flash-attn --kv-type f16
  [ -f $F16 ] && load f16 $F16
fi
echo "ceiling.sh: $(( $(date +%s) - T0 )) s"
