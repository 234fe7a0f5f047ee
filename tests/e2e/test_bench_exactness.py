"""bench/exactness.py: the Q8 activation-rounding hook it compares against (no timing)."""

from __future__ import annotations

import numpy as np

from bench import exactness
from fixtures import oracle, tiny_gguf


def test_q8_blocks_round_each_block_of_32_to_its_own_scale():
    x = np.zeros((1, 64))
    x[0, :4] = [63.5, 0.74, -0.26, 10.0]  # block 0: max 63.5 -> d = 0.5
    x[0, 32:34] = [1.27, 0.0042]  # block 1: max 1.27 -> d = 0.01 (0.01000213... as float16)
    got = exactness.q8_blocks(x)
    np.testing.assert_array_equal(got[0, :4], [63.5, 0.5, -0.5, 10.0])
    d16 = float(np.float16(np.float32(1.27) / np.float32(127)))
    np.testing.assert_array_equal(got[0, 32:34], [127 * d16, 0.0])
    assert not got[0, 4:32].any() and not got[0, 34:].any()


def test_the_hook_leaves_f32_weights_exact_and_rounds_quantized_ones():
    tiny = tiny_gguf.ensure()
    model = oracle.load(tiny)
    ids = [1, 9690, 28, 2114, 314, 504]
    exact = oracle.forward(model, ids)
    np.testing.assert_array_equal(oracle.forward(model, ids, matmul=exactness.q8_matmul(model.types, {})), exact)
    as_q8 = {name: 8 for name in model.types}  # pretend every tensor is Q8_0
    moved = oracle.forward(model, ids, matmul=exactness.q8_matmul(as_q8, {}))
    assert 1e-4 < np.abs(moved - exact).max() < 1.0
