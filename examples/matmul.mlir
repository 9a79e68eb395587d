// A 256x1024x512 f32 matmul: the shipped example for `autosched run examples/matmul.mlir`.
// On a 2-core VM IREE's default CPU configuration of it is about 1.5x slower than the best
// of the shipped cfg's space (benchmarks/results/cpu_landscapes.md), a win that stands
// clear of that machine's 12-20 % timing noise.
func.func @matmul(%lhs: tensor<256x512xf32>, %rhs: tensor<512x1024xf32>) -> tensor<256x1024xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<256x1024xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  %result = linalg.matmul ins(%lhs, %rhs : tensor<256x512xf32>, tensor<512x1024xf32>)
                          outs(%acc : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  return %result : tensor<256x1024xf32>
}
