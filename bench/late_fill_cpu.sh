#!/bin/bash
# The late fill (SERVEPROTO_PIPELINE_LATE) against the tests' pretend device, on this machine's CPU (issue 24).
# The engine runs the pipeline with overlap as on a GPU (SERVEPROTO_PIPELINE, SERVEPROTO_OVERLAP=1) and each
# decode also holds a pretend device US microseconds a row, its rows rounded up to whole ubatches, after
# llama_decode returns (SERVEPROTO_TEST_DEVICE_US_ROW; a GPU computes 400 rows in about the time of 512). With
# US above the host's own time a row, the host has time to wait in, as it would on a GPU with CUDA graphs.
# bench/load.py's document (or WORKLOADS) at 32 clients on a tiny random model (bench/gpu/make_model.py
# --geometry tiny, F16, the default model's tokenizer), one engine thread; PAIRS pairs of cells side by side,
# without and with the late fill; each cell's profile tables (bench/gpu/profile_split.py) after it.
#   bash bench/late_fill_cpu.sh        [US=200] [MARGIN=1000] [PAIRS=2] [SECONDS_CELL=10] [WORKLOADS=document]
# Run from the repository root after `make -C engines all`.
set -euo pipefail
PY=${PY:-.venv/bin/python}
US=${US:-200}
MARGIN=${MARGIN:-1000}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
MODEL=${MODEL:-$DIR/tiny-f16.gguf}
if [ ! -f "$MODEL" ]; then
  "$PY" -m bench.gpu.make_model tokenizer --out "$DIR/tokenizer.gguf" > /dev/null
  "$PY" -m bench.gpu.make_model model --tokenizer "$DIR/tokenizer.gguf" --out "$MODEL" --geometry tiny \
    --type f16 > /dev/null
fi
cell() {  # TAG ENV...
  local tag=$1; shift
  echo "== $tag: $*"
  env SERVEPROTO_PIPELINE=128 SERVEPROTO_OVERLAP=1 SERVEPROTO_TEST_DEVICE_US_ROW="$US" "$@" \
    SERVEPROTO_PROFILE="$DIR/prof-$tag" "$PY" -m bench.load --no-llama-server --workloads "${WORKLOADS:-document}" \
    --clients 32 --seconds "${SECONDS_CELL:-10}" --requests 100000 --debias none --engine engines/bin/serveproto-llama \
    --model "$MODEL" --slots 32 --threads 1 | grep "^| this"
  "$PY" -m bench.gpu.profile_split "$DIR"/prof-"$tag".* | grep "^| prof-$tag"
}
for i in $(seq "${PAIRS:-2}"); do
  cell "without$i"
  cell "late$i" SERVEPROTO_PIPELINE_LATE="$MARGIN"
done
