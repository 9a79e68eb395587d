"""Writes `gemm_matmul_transpose.onnx`: a Gemm(transB=1), a batched MatMul and a Transpose.

Run from anywhere with the `onnx` package installed; it overwrites the file next to this script:

    python tests/data/models/make_onnx_model.py

The graph (f32, weights as initializers so IREE sees constant operands, like a real model):

    x[8, 32] --Gemm(W[24, 32], bias[24], transB=1)--> y[8, 24]
    a[2, 16, 32] --MatMul(b[2, 32, 24])--> c[2, 16, 24] --Transpose(0, 2, 1)--> z[2, 24, 16]
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "gemm_matmul_transpose.onnx")


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((24, 32)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "bias")
    nodes = [
        helper.make_node("Gemm", ["x", "W", "bias"], ["y"], name="gemm", transB=1),
        helper.make_node("MatMul", ["a", "b"], ["c"], name="batched_matmul"),
        helper.make_node("Transpose", ["c"], ["z"], name="transpose", perm=[0, 2, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "gemm_matmul_transpose",
        inputs=[
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32]),
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 16, 32]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 32, 24]),
        ],
        outputs=[
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 24]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 24, 16]),
        ],
        initializer=[weight, bias],
    )
    # Opset 17 and IR version 8: what iree-import-onnx handles without a version conversion.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    onnx.save(build(), PATH)
    print(f"wrote {PATH} ({os.path.getsize(PATH)} bytes)")
