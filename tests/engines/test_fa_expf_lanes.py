"""Patch 0014's eight-lane ``expf`` gives glibc's ``expf`` bits, value for value.

The CPU flash attention of patch 0014 takes its ``expf`` eight lanes at a time with glibc's own
algorithm and constants (``serveproto_expf_n``, spec/llama-engine.md, "0014"), so the engine's digits
stay those of the libm call it replaces. The code is taken from the patch file itself (its added
lines, from the function's opening comment to its ``#endif``), compiled beside a checker, and run
against this machine's ``expf`` on every 61st negative float down to -104 (the arguments the kernel
gives it: a difference from the running maximum), on the boundaries of the lanes' fallback
(|x| >= 88, NaN, infinities) and on a spread of positive values. Any value whose bits differ is a
failure: the arithmetic is exact by construction, so this compares bits, not a tolerance.
(Run once over all 2^32 inputs when the patch was written: none differed.)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PATCH = Path(__file__).resolve().parents[2] / "engines/llama/patches/speed/0014-ggml-cpu-fa-row-blocks.patch"

CHECKER = r"""
#include <immintrin.h>
#include <math.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
@EXPF@
static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
int main() {
    std::vector<uint32_t> in;
    for (uint64_t u = 0x80000000u; u <= 0xC2D00000u; u += 61) in.push_back((uint32_t) u);   // -0 .. -104
    for (uint64_t u = 0; u <= 0x42B40000u; u += 4099) in.push_back((uint32_t) u);          // 0 .. 90
    const uint32_t edge[] = {0xC2B00000u, 0xC2AFFFFFu, 0x42B00000u, 0x42AFFFFFu, 0xFF800000u,
                             0x7F800000u, 0x7FC00000u, 0xFFC00001u, 0x80000001u, 0x00000001u};
    for (uint32_t e : edge) in.push_back(e);
    std::vector<float> x(in.size()), want(in.size());
    for (size_t i = 0; i < in.size(); ++i) { memcpy(&x[i], &in[i], 4); want[i] = expf(x[i]); }
    unsigned long long differ = 0;
    for (size_t i = 0; i < x.size(); i += 4096) {
        const int n = (int) (x.size() - i < 4096 ? x.size() - i : 4096);
        serveproto_expf_n(x.data() + i, n);
    }
    for (size_t i = 0; i < x.size(); ++i) {
        if (bits(x[i]) != bits(want[i])) {
            if (differ < 5) printf("input %08x: lanes %08x, expf %08x\n", in[i], bits(x[i]), bits(want[i]));
            differ++;
        }
    }
    printf("checked %zu differing %llu\n", x.size(), differ);
    return differ != 0;
}
"""


def expf_block(patch_text: str) -> str:
    """The patch's added lines from ``serveproto_expf_n``'s opening comment to the ``#endif`` after it."""
    added = [line[1:] for line in patch_text.splitlines() if line.startswith("+") and not line.startswith("+++")]
    start = next(i for i, line in enumerate(added) if line.startswith("// serveproto: expf of n values"))
    end = next(i for i in range(start, len(added)) if added[i].startswith("#endif"))
    block = "\n".join(added[start:end])
    assert "serveproto_expf_n" in block and "serveproto_exp2f_tab" in block
    return block


def test_eight_lane_expf_equals_libm_expf_bit_for_bit(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "check.cpp"
    src.write_text(CHECKER.replace("@EXPF@", expf_block(PATCH.read_text())))
    exe = tmp_path / "check"
    # the flags of the engine's CPU build that matter here: AVX2 and FMA, optimised (contraction allowed)
    subprocess.run([cxx, "-O3", "-mavx2", "-mfma", "-o", str(exe), str(src), "-lm"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    checked = int(out.stdout.split()[1])
    assert checked > 18_000_000
    assert out.stdout.strip().endswith("differing 0")
