#!/bin/bash
# How one llama_decode's time depends on its shape (issue 24): llama.cpp's own decode of the random 8B in F16
# (flash attention, F16 KV: the GPU defaults), by llama-prefill-ref, best of 3 a line.
#   1. one sequence, 64 to 512 rows at ubatch 512 and 512 to 1024 at ubatch 1024: is a decode's time its rows,
#      or its rows rounded up to a tile?
#   2. mixed decodes shaped like the engine's at 32 clients (bench/results/NOTEBOOK.md, "Inside llama_decode": 400 rows
#      over 1,681 cells on 16 slots, 775 over 3,170 on 32): the rows split over S sequences on one shared
#      prefix, beside other sequences' cells; against one sequence over the same cells, and alone.
# As one of bench/gpu/run.sh's BENCHES, after something wrote the F16 model (bench/gpu/ceiling.sh does):
#   BENCHES=$'extra loads ... bash bench/gpu/ceiling.sh $MODEL\nextra shape bash bench/gpu/shape.sh'
set -u
F16=${1:-/tmp/llama3-8b-random.F16.gguf}
[ -f "$F16" ] || { echo "shape.sh: no model at $F16"; exit 1; }
[ -f /tmp/prompt.txt ] || python3 -c "print('The quarterly report covers revenue, churn and support load. ' * 200)" > /tmp/prompt.txt
ref() {
  echo "== $*"
  engines/bin/llama-prefill-ref --model "$F16" --prompt-file /tmp/prompt.txt --ctx 4096 --reps ${REPS:-3} --modes fa-f16 "$@" |
    awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
           k = v["tokens"] " " v["seqs"] " " v["shared"] " " v["background"]
           if (!(k in best) || v["seconds"] < best[k]) best[k] = v["seconds"] }
         END { for (k in best) printf "tokens/seqs/shared/background %s: best %.2f ms, %.0f rows/s\n", k,
               best[k] * 1e3, (k + 0) / best[k] }' | sort -t: -k1,1V
}
ref --ubatch 512 --tokens 64,128,256,320,384,400,448,480,512
ref --ubatch 1024 --tokens 512,640,768,775,896,1024
ref --ubatch 512 --tokens 400,512 --seqs 10 --shared 300 --background 1300
ref --ubatch 512 --tokens 400,512 --seqs 1 --background 1300
ref --ubatch 1024 --tokens 775,1024 --seqs 19 --shared 300 --background 2400
ref --ubatch 1024 --tokens 775,1024 --seqs 1 --background 2400
