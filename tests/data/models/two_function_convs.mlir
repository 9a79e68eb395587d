// Two functions, a 3x3 convolution each (batch 2): a model of several entry points whose
// convolutions are checked, when their dispatch's check cannot run, on their own function.
func.func @first(%x: tensor<2x8x16x16xf32>, %w: tensor<16x8x3x3xf32>) -> tensor<2x16x14x14xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x16x14x14xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<2x16x14x14xf32>) -> tensor<2x16x14x14xf32>
  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>} ins(%x, %w : tensor<2x8x16x16xf32>, tensor<16x8x3x3xf32>) outs(%f : tensor<2x16x14x14xf32>) -> tensor<2x16x14x14xf32>
  return %c : tensor<2x16x14x14xf32>
}
func.func @second(%x: tensor<2x16x14x14xf32>, %w: tensor<32x16x3x3xf32>) -> tensor<2x32x12x12xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x32x12x12xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<2x32x12x12xf32>) -> tensor<2x32x12x12xf32>
  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>} ins(%x, %w : tensor<2x16x14x14xf32>, tensor<32x16x3x3xf32>) outs(%f : tensor<2x32x12x12xf32>) -> tensor<2x32x12x12xf32>
  return %c : tensor<2x32x12x12xf32>
}
