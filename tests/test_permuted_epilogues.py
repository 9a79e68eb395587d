"""A matmul epilogue whose result permutes the matmul's (issue 24): BERT's q, k and v
projections add their bias as the heads move before the tokens (v's also after its head dim),
one generic IREE runs as a dispatch of its own; the Triton kernel writes each element where
that generic would."""

from __future__ import annotations

import numpy as np
import pytest

from autosched.ops.epilogue import PermutedStore


@pytest.mark.parametrize(
    "order",
    [(0, 2, 1, 3), (0, 2, 3, 1)],  # q, k: [b, h, s, d]; v: [b, h, d, s]
    ids=["heads_first", "heads_first_keys_last"],
)
def test_the_stores_offsets_put_each_element_where_the_permutation_does(order):
    """The kernel's offsets, evaluated by numpy on a whole (m, n) tile of a 2x5 by 3x4
    result (rows split into batch and tokens, columns into heads and head dim), scatter the
    matmul's result into numpy's transpose of it."""
    extents = (2, 5, 3, 4)
    out_shape = [extents[i] for i in order]
    out_strides = [int(np.prod(out_shape[i + 1 :])) for i in range(4)]
    strides = tuple(out_strides[order.index(dim)] for dim in range(4))
    store = PermutedStore(extents, strides, rows=2)
    m, n = 2 * 5, 3 * 4
    result = np.arange(m * n).reshape(m, n)
    namespace = {"rm": np.arange(m), "rn": np.arange(n)}
    offsets = eval(store.offsets("rm[:, None]", "rn[None, :]"), namespace)
    written = np.empty(m * n, dtype=result.dtype)
    written[offsets] = result
    expected = np.transpose(result.reshape(extents), order)
    assert (written.reshape(out_shape) == expected).all()
