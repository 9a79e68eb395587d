#map = affine_map<(d0, d1, d2) -> (d0, d2)>
#map1 = affine_map<(d0, d1, d2) -> (d1, d2)>
#map2 = affine_map<(d0, d1, d2) -> (d0, d1)>
#translation = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [128, 1, 1] subgroup_size = 32>
#translation1 = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<VectorDistribute> workgroup_size = [128, 1, 1] subgroup_size = 32, {iree_codegen.denormal_fp_math_f32 = #iree_codegen.denormal_fp_math<"preserve-sign">}>
#translation2 = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<VectorDistribute> workgroup_size = [128, 1, 1] subgroup_size = 32>
#compilation = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{convert_acc_gemm, mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, promote_operands = [0, 1], reduction = [0, 0, 4], subgroup = [4, 8, 0], workgroup = [128, 128, 0]}>, translation_info = #translation>
#compilation1 = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{promote_operands = [0, 1, 2], promotion_types = [#iree_gpu.derived_thread_config, #iree_gpu.derived_thread_config, #iree_gpu.derived_thread_config], reduction = [0, 0, 0, 0, 0, 64], workgroup = [1, 1, 64, 64, 0, 0]}>, translation_info = #translation1>
#compilation2 = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, promote_operands = [0, 1], reduction = [0, 0, 128], subgroup_basis = [[2, 2, 1], [0, 1, 2]], workgroup = [64, 64, 0]}>, translation_info = #translation2>
module attributes {iree_codegen.tuning_spec_with_default_entrypoint, transform.with_named_sequence} {
  transform.named_sequence @apply_op_config(%arg0: !transform.any_op {transform.readonly}, %arg1: !transform.any_param {transform.readonly}) {
    transform.annotate %arg0 "compilation_info" = %arg1 : !transform.any_op, !transform.any_param
    transform.yield 
  }
  transform.named_sequence @apply_attention_config(%arg0: !transform.any_op {transform.readonly}, %arg1: !transform.any_param {transform.readonly}, %arg2: !transform.any_param {transform.readonly}) {
    transform.annotate %arg0 "compilation_info" = %arg1 : !transform.any_op, !transform.any_param
    transform.annotate %arg0 "decomposition_config" = %arg2 : !transform.any_op, !transform.any_param
    transform.yield 
  }
  transform.named_sequence @match_matmul_transpose_b_4096x768x768_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [4096] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [768] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [768] : !transform.param<i64>
    %0 = transform.param.constant #compilation -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_attention_8x12x512x64x512x64_f16(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param, !transform.any_param) {
    transform.match.operation_name %arg0 ["iree_linalg_ext.online_attention"] : !transform.any_op
    %0 = transform.get_operand %arg0[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %0 = tensor<8x12x512x64xf16> : !transform.any_value
    %1 = transform.get_operand %arg0[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %1 = tensor<8x12x512x64xf16> : !transform.any_value
    %2 = transform.get_operand %arg0[2] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %2 = tensor<8x12x64x512xf16> : !transform.any_value
    %3 = transform.get_operand %arg0[4] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %3 = tensor<8x12x512x64xf32> : !transform.any_value
    %4 = transform.param.constant #compilation1 -> !transform.any_param
    %5 = transform.param.constant {pv_attrs = {lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, promote_operands = [1], promotion_types = [#iree_gpu.derived_thread_config], subgroup_basis = [[1, 1, 4, 1, 1, 1], [0, 1, 2, 3, 5]]}>}, qk_attrs = {lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, promote_operands = [0, 1], promotion_types = [#iree_gpu.derived_thread_config, #iree_gpu.derived_thread_config], subgroup_basis = [[1, 1, 4, 1, 1, 1], [0, 1, 2, 4, 5]]}>}} -> !transform.any_param
    transform.yield %arg0, %4, %5 : !transform.any_op, !transform.any_param, !transform.any_param
  }
  transform.named_sequence @match_matmul_transpose_b_4096x3072x768_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [4096] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [3072] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [768] : !transform.param<i64>
    %0 = transform.param.constant #compilation2 -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_matmul_transpose_b_4096x768x3072_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [4096] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [768] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [3072] : !transform.param<i64>
    %0 = transform.param.constant #compilation -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @__kernel_config(%arg0: !transform.any_op {transform.consumed}) -> !transform.any_op attributes {iree_codegen.tuning_spec_entrypoint} {
    %updated_root = transform.foreach_match in %arg0 
        @match_matmul_transpose_b_4096x768x768_f16_f16_f32 -> @apply_op_config, 
        @match_attention_8x12x512x64x512x64_f16 -> @apply_attention_config, 
        @match_matmul_transpose_b_4096x3072x768_f16_f16_f32 -> @apply_op_config, 
        @match_matmul_transpose_b_4096x768x3072_f16_f16_f32 -> @apply_op_config : (!transform.any_op) -> !transform.any_op
    transform.yield %updated_root : !transform.any_op
  }
}
