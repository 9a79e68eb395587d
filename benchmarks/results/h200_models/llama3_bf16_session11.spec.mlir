#map = affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>
#map1 = affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>
#map2 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
#translation = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [128, 1, 1] subgroup_size = 32>
#translation1 = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<VectorDistribute> workgroup_size = [128, 1, 1] subgroup_size = 32>
#compilation = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{convert_acc_gemm, mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_BF16>, promote_operands = [0, 1], reduction = [0, 0, 0, 4], subgroup = [0, 4, 8, 0], workgroup = [1, 128, 128, 0]}>, translation_info = #translation>
#compilation1 = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_BF16>, promote_operands = [0, 1], reduction = [0, 0, 0, 128], subgroup_basis = [[1, 1, 4, 1], [0, 1, 2, 3]], workgroup = [1, 128, 128, 0]}>, translation_info = #translation1>
module attributes {iree_codegen.tuning_spec_with_default_entrypoint, transform.with_named_sequence} {
  transform.named_sequence @apply_op_config(%arg0: !transform.any_op {transform.readonly}, %arg1: !transform.any_param {transform.readonly}) {
    transform.annotate %arg0 "compilation_info" = %arg1 : !transform.any_op, !transform.any_param
    transform.yield 
  }
  transform.named_sequence @match_batch_matmul_1x2048x4096x4096_bf16_bf16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = bf16, rhs_type = bf16, output_type = f32, indexing_maps = [#map, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [1] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [2048] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [4096] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [4096] : !transform.param<i64>
    %0 = transform.param.constant #compilation -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_batch_matmul_1x2048x1024x4096_bf16_bf16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = bf16, rhs_type = bf16, output_type = f32, indexing_maps = [#map, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [1] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [2048] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [1024] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [4096] : !transform.param<i64>
    %0 = transform.param.constant #compilation1 -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_batch_matmul_1x2048x14336x4096_bf16_bf16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = bf16, rhs_type = bf16, output_type = f32, indexing_maps = [#map, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [1] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [2048] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [14336] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [4096] : !transform.param<i64>
    %0 = transform.param.constant #compilation -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_batch_matmul_1x2048x4096x14336_bf16_bf16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = bf16, rhs_type = bf16, output_type = f32, indexing_maps = [#map, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [1] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [2048] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [4096] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [14336] : !transform.param<i64>
    %0 = transform.param.constant #compilation -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @__kernel_config(%arg0: !transform.any_op {transform.consumed}) -> !transform.any_op attributes {iree_codegen.tuning_spec_entrypoint} {
    %updated_root = transform.foreach_match in %arg0 
        @match_batch_matmul_1x2048x4096x4096_bf16_bf16_f32 -> @apply_op_config, 
        @match_batch_matmul_1x2048x1024x4096_bf16_bf16_f32 -> @apply_op_config, 
        @match_batch_matmul_1x2048x14336x4096_bf16_bf16_f32 -> @apply_op_config, 
        @match_batch_matmul_1x2048x4096x14336_bf16_bf16_f32 -> @apply_op_config : (!transform.any_op) -> !transform.any_op
    transform.yield %updated_root : !transform.any_op
  }
}
