#map = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d4, d2 + d5, d3 + d6)>
#map1 = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d1, d4, d5, d6)>
#map2 = affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1, d2, d3)>
#map3 = affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>
#map4 = affine_map<(d0, d1, d2, d3) -> (d1, d3)>
#map5 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
#map6 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2, d3)>
#map7 = affine_map<(d0, d1, d2, d3, d4) -> (d1, d4)>
#map8 = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>
#translation = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [256, 1, 1] subgroup_size = 32, {gpu_pipeline_options = #iree_gpu.pipeline_options<prefetch_num_stages = 2, no_reduce_shared_memory_bank_conflicts = false, use_igemm_convolution = true>}>
#translation1 = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [128, 1, 1] subgroup_size = 32, {gpu_pipeline_options = #iree_gpu.pipeline_options<prefetch_num_stages = 2, no_reduce_shared_memory_bank_conflicts = false, use_igemm_convolution = false>}>
#translation2 = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [64, 1, 1] subgroup_size = 32, {gpu_pipeline_options = #iree_gpu.pipeline_options<prefetch_num_stages = 2, no_reduce_shared_memory_bank_conflicts = false, use_igemm_convolution = false>}>
#compilation = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{convert_acc_gemm, mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, padding = [1, 64, 2, 32, 128], promote_operands = [0, 1], reduction = [0, 0, 0, 0, 8], subgroup = [1, 2, 2, 1, 0], workgroup = [1, 64, 2, 32, 0]}>, translation_info = #translation>
#compilation1 = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{convert_acc_gemm, mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, padding = [1, 64, 64, 64], promote_operands = [0, 1], reduction = [0, 0, 0, 4], subgroup = [1, 4, 2, 0], workgroup = [1, 64, 64, 0]}>, translation_info = #translation1>
#compilation2 = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{convert_acc_gemm, mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, padding = [1, 64, 1, 16, 64], promote_operands = [0, 1], reduction = [0, 0, 0, 0, 4], subgroup = [1, 4, 1, 1, 0], workgroup = [1, 64, 1, 16, 0]}>, translation_info = #translation2>
#compilation3 = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{convert_acc_gemm, mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, padding = [4, 64, 1, 16, 128], promote_operands = [0, 1], reduction = [0, 0, 0, 0, 8], subgroup = [2, 4, 1, 1, 0], workgroup = [4, 64, 1, 16, 0]}>, translation_info = #translation1>
#compilation4 = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{convert_acc_gemm, mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, padding = [4, 128, 1, 8, 128], promote_operands = [0, 1], reduction = [0, 0, 0, 0, 8], subgroup = [2, 2, 1, 1, 0], workgroup = [4, 128, 1, 8, 0]}>, translation_info = #translation>
module attributes {iree_codegen.tuning_spec_with_default_entrypoint, transform.with_named_sequence} {
  transform.named_sequence @apply_op_config(%arg0: !transform.any_op {transform.readonly}, %arg1: !transform.any_param {transform.readonly}) {
    transform.annotate %arg0 "compilation_info" = %arg1 : !transform.any_op, !transform.any_param
    transform.yield 
  }
  transform.named_sequence @match_conv_nfohowckhkw_16x128x28x28x128x3x3_s1x1_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %output_image_dims, %output_channel_dims, %filter_dims, %input_channel_dims, %depth_dims, %strides, %dilations = transform.iree.match.convolution %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [16] : !transform.param<i64>
    transform.iree.match.dims_equal %output_image_dims, [28, 28] : !transform.param<i64>
    transform.iree.match.dims_equal %output_channel_dims, [128] : !transform.param<i64>
    transform.iree.match.dims_equal %filter_dims, [3, 3] : !transform.param<i64>
    transform.iree.match.dims_equal %input_channel_dims, [128] : !transform.param<i64>
    transform.iree.match.dims_equal %depth_dims, [] : !transform.param<i64>
    %0 = transform.param.constant #compilation -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfowc_16x1024x196x256_s1x1_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map3, #map4, #map5] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [16, 196] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [1024] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [256] : !transform.param<i64>
    %0 = transform.param.constant #compilation1 -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowc_16x2048x7x7x1024_s1x1_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map6, #map7, #map8] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [16, 7, 7] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [2048] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [1024] : !transform.param<i64>
    %0 = transform.param.constant #compilation2 -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowc_16x512x7x7x2048_s1x1_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %m_dims, %n_dims, %k_dims = transform.iree.match.contraction %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map6, #map7, #map8] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [] : !transform.param<i64>
    transform.iree.match.dims_equal %m_dims, [16, 7, 7] : !transform.param<i64>
    transform.iree.match.dims_equal %n_dims, [512] : !transform.param<i64>
    transform.iree.match.dims_equal %k_dims, [2048] : !transform.param<i64>
    %0 = transform.param.constant #compilation3 -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @match_conv_nfohowckhkw_16x512x7x7x512x3x3_s1x1_f16_f16_f32(%arg0: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %batch_dims, %output_image_dims, %output_channel_dims, %filter_dims, %input_channel_dims, %depth_dims, %strides, %dilations = transform.iree.match.convolution %arg0, lhs_type = f16, rhs_type = f16, output_type = f32, indexing_maps = [#map, #map1, #map2] : !transform.any_op -> !transform.param<i64>
    transform.iree.match.dims_equal %batch_dims, [16] : !transform.param<i64>
    transform.iree.match.dims_equal %output_image_dims, [7, 7] : !transform.param<i64>
    transform.iree.match.dims_equal %output_channel_dims, [512] : !transform.param<i64>
    transform.iree.match.dims_equal %filter_dims, [3, 3] : !transform.param<i64>
    transform.iree.match.dims_equal %input_channel_dims, [512] : !transform.param<i64>
    transform.iree.match.dims_equal %depth_dims, [] : !transform.param<i64>
    %0 = transform.param.constant #compilation4 -> !transform.any_param
    transform.yield %arg0, %0 : !transform.any_op, !transform.any_param
  }
  transform.named_sequence @__kernel_config(%arg0: !transform.any_op {transform.consumed}) -> !transform.any_op attributes {iree_codegen.tuning_spec_entrypoint} {
    %updated_root = transform.foreach_match in %arg0 
        @match_conv_nfohowckhkw_16x128x28x28x128x3x3_s1x1_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfowc_16x1024x196x256_s1x1_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowc_16x2048x7x7x1024_s1x1_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowc_16x512x7x7x2048_s1x1_f16_f16_f32 -> @apply_op_config, 
        @match_conv_nfohowckhkw_16x512x7x7x512x3x3_s1x1_f16_f16_f32 -> @apply_op_config : (!transform.any_op) -> !transform.any_op
    transform.yield %updated_root : !transform.any_op
  }
}
