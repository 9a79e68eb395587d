#map = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2 * 2, d3 * 2)>
#map1 = affine_map<(d0, d1, d2, d3, d4) -> (d1, d4)>
#map2 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>
#translation = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [256, 1, 1] subgroup_size = 32>
#translation1 = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [128, 1, 1] subgroup_size = 32>
#translation2 = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [64, 1, 1] subgroup_size = 32>
#compilation = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{promote_operands = [0, 1], reduction = [0, 0, 0, 0, 16], thread = [1, 4, 1, 2, 0], workgroup = [1, 64, 1, 32, 0]}>, translation_info = #translation>
#compilation1 = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{promote_operands = [0, 1], reduction = [0, 0, 0, 0, 16], thread = [1, 4, 1, 2, 0], workgroup = [1, 64, 1, 16, 0]}>, translation_info = #translation1>
#compilation2 = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{promote_operands = [0, 1], reduction = [0, 0, 0, 0, 16], thread = [1, 4, 1, 2, 0], workgroup = [1, 64, 1, 8, 0]}>, translation_info = #translation2>
module attributes {iree_codegen.tuning_spec_with_default_entrypoint, transform.with_named_sequence} {
  transform.named_sequence @apply_op_config(%arg0: !transform.any_op {transform.readonly}, %arg1: !transform.any_param {transform.readonly}) {
    transform.annotate %arg0 "compilation_info" = %arg1 : !transform.any_op, !transform.any_param
    transform.yield 
  }
  transform.named_sequence @match_conv_nfohowc_16x512x28x28x256_s2x2_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
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
    transform.iree.match.cast_compatible_type %0 = tensor<16x256x?x?xf16> : !transform.any_value
    %1 = transform.get_operand %arg0[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %1 = tensor<512x256xf16> : !transform.any_value
    %2 = transform.get_operand %arg0[2] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %2 = tensor<16x512x28x28xf32> : !transform.any_value
    %3 = transform.param.constant #compilation -> !transform.any_param
    transform.yield %arg0, %3 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowc_16x1024x14x14x512_s2x2_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
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
    transform.iree.match.cast_compatible_type %0 = tensor<16x512x?x?xf16> : !transform.any_value
    %1 = transform.get_operand %arg0[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %1 = tensor<1024x512xf16> : !transform.any_value
    %2 = transform.get_operand %arg0[2] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %2 = tensor<16x1024x14x14xf32> : !transform.any_value
    %3 = transform.param.constant #compilation1 -> !transform.any_param
    transform.yield %arg0, %3 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowc_16x2048x7x7x1024_s2x2_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
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
    transform.iree.match.cast_compatible_type %0 = tensor<16x1024x?x?xf16> : !transform.any_value
    %1 = transform.get_operand %arg0[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %1 = tensor<2048x1024xf16> : !transform.any_value
    %2 = transform.get_operand %arg0[2] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %2 = tensor<16x2048x7x7xf32> : !transform.any_value
    %3 = transform.param.constant #compilation2 -> !transform.any_param
    transform.yield %arg0, %3 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @__kernel_config(%arg0: !transform.any_op {transform.consumed}) -> !transform.any_op attributes {iree_codegen.tuning_spec_entrypoint} {
    %updated_root = transform.foreach_match in %arg0 
        @match_conv_nfohowc_16x512x28x28x256_s2x2_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowc_16x1024x14x14x512_s2x2_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowc_16x2048x7x7x1024_s2x2_f16_f16_f32 -> @apply_op_config : (!transform.any_op) -> !transform.any_op
    transform.yield %updated_root : !transform.any_op
  }
}
