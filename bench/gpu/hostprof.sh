#!/bin/bash
# Where the engine's host time goes under load, by function (issue 24): one of bench/gpu/run.sh's BENCHES,
#   BENCHES='extra hostprof bash bench/gpu/hostprof.sh TAG MODEL [ENGINE_FLAGS...]' EXTRAS=0 bash bench/gpu/run.sh
# bench/load.py runs the document workload at 32 clients for LOAD_S seconds (the engine profiled by
# SERVEPROTO_PROFILE); in its middle `perf record -g` samples the engine for PERF_S seconds; then the
# flat profile and the callers of llama_decode's host work. perf travels in carry/perf (this machine's
# /usr/bin/perf and its libraries, without the C library's own: `bench/gpu/prepare.sh` does not add it;
# copy it by hand, see bench/results/NOTEBOOK.md).
set -u
TAG=$1 MODEL=$2
shift 2
RES=${RES:-/tmp/gpu-res}
C=${CARRY:-bench/gpu/carry}
PERF="env LD_LIBRARY_PATH=$C/perf $C/perf/perf"
$PERF --version || { echo "hostprof: no usable perf in $C/perf"; exit 1; }
rm -f /tmp/prof-$TAG.*
SERVEPROTO_PROFILE=/tmp/prof-$TAG python3 -m bench.load --no-llama-server --model $MODEL --workloads document \
  --clients 32 --seconds ${LOAD_S:-20} --requests 999999 --debias none --engine engines/bin/serveproto-llama --model $MODEL "$@" \
  > $RES/hostprof-load-$TAG.log 2>&1 &
LOAD=$!
for _ in $(seq 60); do  # the engine up and the cell running: its profile file has a busy line
  sleep 1
  f=$(ls /tmp/prof-$TAG.* 2>/dev/null | head -1)
  [ -n "$f" ] && [ "$(wc -l < "$f")" -gt 4 ] && break
done
# the profile file is named after the engine's pid (a cell of 1000 requests once ended before a pgrep)
PID=${f##*.}
echo "hostprof $TAG: engine pid $PID, perf for ${PERF_S:-6} s"
$PERF record -F 1999 -g -p "$PID" -o /tmp/perf-$TAG.data -- sleep ${PERF_S:-6} 2>&1 | tail -1
wait $LOAD
grep "^|" $RES/hostprof-load-$TAG.log | grep -v "^|---" | cut -d'|' -f2-8
python3 -m bench.gpu.profile_split --tag "$TAG" /tmp/prof-$TAG.*
cp /tmp/prof-$TAG.* $RES/ 2>/dev/null
echo "== $TAG: flat (self), the engine's main thread and the rest"
$PERF report -i /tmp/perf-$TAG.data --stdio --no-children --sort comm,symbol -g none --percent-limit 0.4 2>/dev/null \
  | grep -E "^ +[0-9]" | cut -c1-160 | head -45 | tee $RES/perf-$TAG-flat.txt
echo "== $TAG: inclusive (children), main thread"
$PERF report -i /tmp/perf-$TAG.data --stdio --children --sort symbol -g none --percent-limit 1.5 \
  --comm serveproto-llam 2>/dev/null | grep -E "^ +[0-9]" | cut -c1-160 | head -45 | tee $RES/perf-$TAG-incl.txt
echo "== $TAG: flat (self) by library and symbol, main thread"
$PERF report -i /tmp/perf-$TAG.data --stdio --no-children --sort dso,symbol -g none --percent-limit 0.5 \
  --comm serveproto-llam 2>/dev/null | grep -E "^ +[0-9]" | cut -c1-160 | head -60 | tee $RES/perf-$TAG-dso.txt
