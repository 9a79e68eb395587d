// Matmuls whose rows no power-of-two tile divides: a ViT-B/16's 197 tokens at batch 1
// (its projections and MLP, and one head's attention scores). See
// benchmarks/results/cpu_partial_tiles.md.
func.func @qkv(%a: tensor<197x768xf32>, %b: tensor<768x768xf32>) -> tensor<197x768xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<197x768xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<197x768xf32>) -> tensor<197x768xf32>
  %r = linalg.matmul ins(%a, %b : tensor<197x768xf32>, tensor<768x768xf32>) outs(%f : tensor<197x768xf32>) -> tensor<197x768xf32>
  return %r : tensor<197x768xf32>
}
func.func @fc1(%a: tensor<197x768xf32>, %b: tensor<768x3072xf32>) -> tensor<197x3072xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<197x3072xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<197x3072xf32>) -> tensor<197x3072xf32>
  %r = linalg.matmul ins(%a, %b : tensor<197x768xf32>, tensor<768x3072xf32>) outs(%f : tensor<197x3072xf32>) -> tensor<197x3072xf32>
  return %r : tensor<197x3072xf32>
}
func.func @scores(%a: tensor<12x197x64xf32>, %b: tensor<12x64x197xf32>) -> tensor<12x197x197xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<12x197x197xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<12x197x197xf32>) -> tensor<12x197x197xf32>
  %r = linalg.batch_matmul ins(%a, %b : tensor<12x197x64xf32>, tensor<12x64x197xf32>) outs(%f : tensor<12x197x197xf32>) -> tensor<12x197x197xf32>
  return %r : tensor<12x197x197xf32>
}
