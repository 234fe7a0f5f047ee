#!/bin/bash
# Fills bench/gpu/carry/ (ignored) with what bench/gpu/run.sh needs on a GPU machine without
# network: the llama.cpp source subset (tgz), the tokenizer of the default model as a
# tensor-less GGUF, and the wheels of the Python packages that machine lacks (for CPython 3.12);
# for bench/gpu/load.sh also the source llama-server builds from (llama-full.tgz, about 10 MB;
# LLAMA_SERVER=0 leaves it out) and, with BASELINE=<commit>, that commit's tree (baseline.tgz).
# A ggml-cuda compiled here (bench/gpu/prebuild_cuda.sh, ggml-cuda.a.xz) stays in the carry; it and
# llama-full.tgz together are over a call's 64 MiB.
# Run from the repository root, after `make engines model` (it reuses the cached sdist and model).
#   bench/gpu/prepare.sh            then: run bench/gpu/run.sh there with carry=[bench/gpu/carry]
#   BASELINE=26498d7 bench/gpu/prepare.sh
set -euo pipefail
PY=${PY:-.venv/bin/python}
C=bench/gpu/carry
mkdir -p $C/whl
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
make -s -C engines llama-src DEST="$tmp/src"
tar -czf $C/llama-src.tgz -C "$tmp/src" .
$PY -m bench.gpu.make_model tokenizer --out $C/tokenizer.gguf
rm -f $C/llama-full.tgz $C/baseline.tgz  # a carry of an earlier preparation must not outlive it
if [ "${LLAMA_SERVER:-1}" = 1 ]; then
  make -s -C engines llama-server-src DEST="$tmp/full"
  tar -czf $C/llama-full.tgz -C "$tmp/full" .
fi
[ -z "${BASELINE:-}" ] || git archive --format=tar.gz -o $C/baseline.tgz "$BASELINE"
# bench/decisions.py as committed (another engineer may be editing the working tree's copy);
# run.sh puts it in place of the device copy's bench/decisions.py for its fixture part.
git show HEAD:bench/decisions.py > $C/decisions.py
# Pinned to the versions of the project's venv; pure-Python ones except orjson and zstandard.
# httpx2, httpcore2 and truststore: the HTTP client of bench/decisions.py (run.sh's extras).
pins=""
for p in gguf orjson zstandard anyio h11 attrs prometheus-client httpx2 httpcore2 truststore; do
  pins="$pins $p==$($PY -m pip show $p | sed -n 's/^Version: //p')"
done
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d $C/whl $pins
du -sh $C/* $C
# a call carries the working tree and the carry together, 64 MiB at most
total=$(( $(du -sb $C | cut -f1) + $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) ))
[ $total -le $(( 64 * 1024 * 1024 )) ] || echo "warning: the tree and $C come to $(( total >> 20 )) MiB, over a call's" \
  "64 MiB: leave out llama-full.tgz (LLAMA_SERVER=0) or ggml-cuda.a.xz (bench/gpu/prebuild_cuda.sh)" >&2
