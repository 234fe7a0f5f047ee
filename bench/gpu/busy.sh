#!/bin/bash
# Issue 24's yardsticks for the engine under load, measured on the same machine in the same call: llama.cpp's
# own prefill of the random 8B in F16 (flash attention, F16 KV: the GPU defaults), by llama-prefill-ref.
#   1. the ceiling: 512 and 2048 tokens at ubatch 512, best of 3 (tokens/s);
#   2. the steps: one decode of 128 to 512 rows at ubatch 512 (is a decode's time its rows, or its rows rounded
#      up to what the GPU computes in one go?), best of 3; STEPS=N,N,... other row counts;
#   3. what nvidia-smi calls busy while llama.cpp itself prefills 512 tokens back to back (REPS times, about
#      20 ms each): the same measure as the engine's "SM busy" in bench/gpu/profile_split.py.
# As one of bench/gpu/run.sh's BENCHES once the F16 model exists (run.sh F16_EARLY=1 writes it beside the build):
#   F16_EARLY=1 BENCHES=$'extra busy bash bench/gpu/busy.sh\n...' EXTRAS=0 bash bench/gpu/run.sh
set -u
F16=${1:-/tmp/llama3-8b-random.F16.gguf}
RES=${RES:-/tmp/gpu-res}
while [ ! -f "$F16" ] && pgrep -f "make_model.py model .*--type f16" > /dev/null; do sleep 2; done
[ -f "$F16" ] || { echo "busy.sh: no model at $F16"; exit 1; }
[ -f /tmp/prompt.txt ] || python3 -c "print('The quarterly report covers revenue, churn and support load across all regions. ' * 200)" > /tmp/prompt.txt
ref() {
  engines/bin/llama-prefill-ref --model "$F16" --prompt-file /tmp/prompt.txt --ctx 4096 --modes fa-f16 "$@"
}
best() {  # the best seconds of each token count, as ms and rows/s
  awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
         if (!(v["tokens"] in b) || v["seconds"] < b[v["tokens"]]) b[v["tokens"]] = v["seconds"] }
       END { for (k in b) printf "%s tokens: best %.2f ms, %.0f tokens/s\n", k, b[k] * 1e3, k / b[k] }' | sort -n
}
echo "== the ceiling (ubatch 512)"
ref --reps 3 --ubatch 512 --tokens 512,2048 | best
echo "== one decode of N rows (ubatch 512)"
ref --reps 3 --ubatch 512 --tokens ${STEPS:-128,192,256,320,384,448,512} | best
echo "== nvidia-smi dmon beside ${REPS:-300} decodes of 512 tokens"
nvidia-smi dmon -s u -d 1 -o T > $RES/dmon-busy.log 2>&1 &
D=$!
ref --reps ${REPS:-300} --ubatch 512 --tokens 512 | best
kill $D
python3 -c "import sys; from pathlib import Path; from bench.gpu.profile_split import dmon_mean; print(dmon_mean(Path(sys.argv[1])))" $RES/dmon-busy.log
