#config = #iree_cpu.lowering_config<distribution = [1, 64, 2, 8, 0], vector_common_parallel = [1, 2, 1, 4, 0], vector_reduction = [0, 0, 0, 0, 4]>
#config1 = #iree_cpu.lowering_config<distribution = [1, 64, 2, 2, 0], vector_common_parallel = [1, 2, 1, 2, 0], vector_reduction = [0, 0, 0, 0, 16]>
#config2 = #iree_cpu.lowering_config<distribution = [1, 1, 32, 2, 1, 0, 0, 0], vector_common_parallel = [1, 1, 4, 1, 1, 0, 0, 0], vector_reduction = [0, 0, 0, 0, 0, 4, 1, 1]>
#config3 = #iree_cpu.lowering_config<distribution = [1, 32, 2, 1, 0], vector_common_parallel = [1, 8, 1, 1, 0], vector_reduction = [0, 0, 0, 0, 4]>
#config4 = #iree_cpu.lowering_config<distribution = [1, 64, 1, 2, 0], vector_common_parallel = [1, 8, 1, 2, 0], vector_reduction = [0, 0, 0, 0, 16]>
#map = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2 * 2, d3 * 2)>
#map1 = affine_map<(d0, d1, d2, d3, d4) -> (d1, d4)>
#map2 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>
#map3 = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d5, d3 * 2 + d6, d4 * 2 + d7)>
#map4 = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d1, d2, d5, d6, d7)>
#map5 = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
#map6 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2, d3)>
#map7 = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d5, d3 + d6, d4 + d7)>
#translation = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>
#translation1 = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<ConvTileAndDecomposeExpert>>
#compilation = #iree_codegen.compilation_info<lowering_config = #config, translation_info = #translation>
#compilation1 = #iree_codegen.compilation_info<lowering_config = #config1, translation_info = #translation>
#compilation2 = #iree_codegen.compilation_info<lowering_config = #config2, translation_info = #translation1>
#compilation3 = #iree_codegen.compilation_info<lowering_config = #config3, translation_info = #translation>
#compilation4 = #iree_codegen.compilation_info<lowering_config = #config4, translation_info = #translation>
module attributes {iree_codegen.tuning_spec_with_default_entrypoint, transform.with_named_sequence} {
  transform.named_sequence @apply_op_config(%arg0: !transform.any_op {transform.readonly}, %arg1: !transform.any_param {transform.readonly}) {
    transform.annotate %arg0 "compilation_info" = %arg1 : !transform.any_op, !transform.any_param
    transform.yield 
  }
  transform.named_sequence @match_conv_nfohowc_2x512x8x8x256_s2x2_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %inputs, %outputs = transform.iree.match.cast_compatible_dag_from_root %arg0 {
    ^bb0(%arg1: tensor<?x?x?x?xf16>, %arg2: tensor<?x?xf16>, %arg3: tensor<?x?x?x?xf32>):
      %4 = linalg.generic {indexing_maps = [#map, #map1, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%arg1, %arg2 : tensor<?x?x?x?xf16>, tensor<?x?xf16>) outs(%arg3 : tensor<?x?x?x?xf32>) {
      ^bb0(%in: f16, %in_0: f16, %out: f32):
        %5 = arith.extf %in : f16 to f32
        %6 = arith.extf %in_0 : f16 to f32
        %7 = arith.mulf %5, %6 : f32
        %8 = arith.addf %out, %7 : f32
        linalg.yield %8 : f32
      } -> tensor<?x?x?x?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %0 = transform.get_operand %arg0[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %0 = tensor<2x256x?x?xf16> : !transform.any_value
    %1 = transform.get_operand %arg0[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %1 = tensor<512x256xf16> : !transform.any_value
    %2 = transform.get_operand %arg0[2] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %2 = tensor<2x512x8x8xf32> : !transform.any_value
    %3 = transform.param.constant #compilation -> !transform.any_param
    transform.yield %arg0, %3 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowc_2x1024x4x4x512_s2x2_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %inputs, %outputs = transform.iree.match.cast_compatible_dag_from_root %arg0 {
    ^bb0(%arg1: tensor<?x?x?x?xf16>, %arg2: tensor<?x?xf16>, %arg3: tensor<?x?x?x?xf32>):
      %4 = linalg.generic {indexing_maps = [#map, #map1, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%arg1, %arg2 : tensor<?x?x?x?xf16>, tensor<?x?xf16>) outs(%arg3 : tensor<?x?x?x?xf32>) {
      ^bb0(%in: f16, %in_0: f16, %out: f32):
        %5 = arith.extf %in : f16 to f32
        %6 = arith.extf %in_0 : f16 to f32
        %7 = arith.mulf %5, %6 : f32
        %8 = arith.addf %out, %7 : f32
        linalg.yield %8 : f32
      } -> tensor<?x?x?x?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %0 = transform.get_operand %arg0[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %0 = tensor<2x512x?x?xf16> : !transform.any_value
    %1 = transform.get_operand %arg0[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %1 = tensor<1024x512xf16> : !transform.any_value
    %2 = transform.get_operand %arg0[2] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %2 = tensor<2x1024x4x4xf32> : !transform.any_value
    %3 = transform.param.constant #compilation1 -> !transform.any_param
    transform.yield %arg0, %3 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowckhkwg_2x32x2x2x32x3x3x32_s2x2_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %output_image_dims, %output_channel_dims, %filter_dims, %input_channel_dims, %depth_dims, %strides, %dilations = transform.iree.match.convolution %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map3, #map4, #map5] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [2] : !transform.param<i64>
    transform.iree.match.dims_equal %output_image_dims, [2, 2] : !transform.param<i64>
    transform.iree.match.dims_equal %output_channel_dims, [32] : !transform.param<i64>
    transform.iree.match.dims_equal %filter_dims, [3, 3] : !transform.param<i64>
    transform.iree.match.dims_equal %input_channel_dims, [32] : !transform.param<i64>
    transform.iree.match.dims_equal %depth_dims, [32] : !transform.param<i64>
    %0 = transform.param.constant #compilation2 -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowc_2x2048x2x2x1024_s2x2_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %inputs, %outputs = transform.iree.match.cast_compatible_dag_from_root %arg0 {
    ^bb0(%arg1: tensor<?x?x?x?xf16>, %arg2: tensor<?x?xf16>, %arg3: tensor<?x?x?x?xf32>):
      %4 = linalg.generic {indexing_maps = [#map, #map1, #map2], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%arg1, %arg2 : tensor<?x?x?x?xf16>, tensor<?x?xf16>) outs(%arg3 : tensor<?x?x?x?xf32>) {
      ^bb0(%in: f16, %in_0: f16, %out: f32):
        %5 = arith.extf %in : f16 to f32
        %6 = arith.extf %in_0 : f16 to f32
        %7 = arith.mulf %5, %6 : f32
        %8 = arith.addf %out, %7 : f32
        linalg.yield %8 : f32
      } -> tensor<?x?x?x?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %0 = transform.get_operand %arg0[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %0 = tensor<2x1024x?x?xf16> : !transform.any_value
    %1 = transform.get_operand %arg0[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %1 = tensor<2048x1024xf16> : !transform.any_value
    %2 = transform.get_operand %arg0[2] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %2 = tensor<2x2048x2x2xf32> : !transform.any_value
    %3 = transform.param.constant #compilation3 -> !transform.any_param
    transform.yield %arg0, %3 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowc_2x1024x2x2x2048_s1x1_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map6, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [2, 2, 2] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [1024] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [2048] : !transform.param<i64>
    %0 = transform.param.constant #compilation4 -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowckhkwg_2x32x2x2x32x3x3x32_s1x1_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %output_image_dims, %output_channel_dims, %filter_dims, %input_channel_dims, %depth_dims, %strides, %dilations = transform.iree.match.convolution %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map7, #map4, #map5] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [2] : !transform.param<i64>
    transform.iree.match.dims_equal %output_image_dims, [2, 2] : !transform.param<i64>
    transform.iree.match.dims_equal %output_channel_dims, [32] : !transform.param<i64>
    transform.iree.match.dims_equal %filter_dims, [3, 3] : !transform.param<i64>
    transform.iree.match.dims_equal %input_channel_dims, [32] : !transform.param<i64>
    transform.iree.match.dims_equal %depth_dims, [32] : !transform.param<i64>
    %0 = transform.param.constant #compilation2 -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowc_2x2048x2x2x1024_s1x1_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map6, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [2, 2, 2] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [2048] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [1024] : !transform.param<i64>
    %0 = transform.param.constant #compilation4 -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @__kernel_config(%arg0: !transform.any_op {transform.consumed}) -> !transform.any_op attributes {iree_codegen.tuning_spec_entrypoint} {
    %updated_root = transform.foreach_match in %arg0 
        @match_conv_nfohowc_2x512x8x8x256_s2x2_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowc_2x1024x4x4x512_s2x2_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowckhkwg_2x32x2x2x32x3x3x32_s2x2_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowc_2x2048x2x2x1024_s2x2_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowc_2x1024x2x2x2048_s1x1_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowckhkwg_2x32x2x2x32x3x3x32_s1x1_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowc_2x2048x2x2x1024_s1x1_f16_f16_f32 -> @apply_op_config : (!transform.any_op) -> !transform.any_op
    transform.yield %updated_root : !transform.any_op
  }
}
