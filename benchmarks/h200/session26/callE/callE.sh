#!/usr/bin/env bash
# Session 26, call E (one H200): four processes side by side on the one card, from a snapshot of the working tree:
# the GPU model test for the session's new and changed model files (two halves), verify-chains over the session's new
# chains, then the 16 half chains of .device/h3 not yet verified; the later-region std test.
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
cp -r .device/h3 /tmp/snap/
cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=6
nvidia-smi -L > "$OUT/gpus.txt"
P="-p no:cacheprovider -rfE -m gpu -v"
T="test_the_fused_chains_run_their_kernels_on_a_gpu"
( export FUSETUNE_CACHE_DIR=/tmp/c1
  timeout 480 python3 -m pytest $P -s tests/test_optimize.py -k "$T and (kb_conv2d_hardswish_by_hand_expression_pools or kb_conv2d_custom_pointwise_forms or sweep4_kb_convt3d_logsumexp_sigmoid_swish_sub_clamp_max or vae_block_conv_in_returned or conv2d_shared_output or conv_pools_dilation_divisor)" > $OUT/models1.log 2>&1
  echo "exit $?" >> $OUT/models1.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c2
  timeout 480 python3 -m pytest $P -s tests/test_optimize.py -k "$T and (sweep3_diffusion_resblock_temb_proj or sweep3_fpn_topdown_interpolate or sweep4_pool_options_indices_near_misses or conv2d_instnorm_log_nan_to_num_softmax_dtype_var_std or sweep4_masked_fill_nan_to_num_clamp_methods)" > $OUT/models2.log 2>&1
  echo "exit $?" >> $OUT/models2.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c3
  timeout 480 python3 scripts/verify-chains --out $OUT/verify-new.json $(cat new_chains.txt) > $OUT/verify-new.log 2>&1
  echo "exit $?" >> $OUT/verify-new.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c4
  timeout 150 python3 -m pytest $P -s tests/test_gpu_pipeline.py -k "test_a_later_region_on_a_view_is_tuned_and_runs_through_its_view and std_spatial" > $OUT/pipeline.log 2>&1
  echo "exit $?" >> $OUT/pipeline.log
  timeout 320 python3 scripts/verify-chains --out $OUT/verify-h3.json h3/sweep4_half_conv2d_strided_groupnorm_gelu_maxpool_ceil_ieee.yaml h3/sweep4_half_conv2d_wide100_softmax_channels_bf16.yaml h3/sweep4_half_conv2d_wide64_grouped_strided_relu_maxpool_ceil_fp16.yaml h3/sweep4_half_conv3d_avgpool_padded_noinclude_mean_channels_fp16.yaml h3/sweep4_half_conv3d_logsumexp_channels_fp16.yaml h3/sweep4_half_conv3d_same_softmax_channels_amax_spatial_bf16.yaml h3/sweep4_half_conv3d_scalar_scale_sigmoid_mul_input_bf16.yaml h3/sweep4_half_conv3d_wide100_groupnorm_relu_gap_bf16.yaml h3/sweep4_half_convt1d_outpad_batchnorm_tanh_maxpool_fp16.yaml h3/sweep4_half_convt1d_stride3_dilated_layernorm_last_gelu_bf16.yaml h3/sweep4_half_convt2d_dilated_softmax_channels_mean_spatial_fp16.yaml h3/sweep4_half_convt2d_outpad_groupnorm_relu_avgpool_ceil_fp16.yaml h3/sweep4_half_convt2d_wide100_bneval_relu6_adaptiveavgpool_grid_bf16.yaml h3/sweep4_half_convt3d_groupnorm3_silu_mean_channels_keepdim_bf16.yaml h3/sweep4_half_convt3d_outpad_instancenorm_clamp_maxpool_fp16.yaml h3/sweep4_half_convt3d_sum_channels_amax_spatial_fp16.yaml  > $OUT/verify-h3.log 2>&1
  echo "exit $?" >> $OUT/verify-h3.log ) &
wait
grep -h "PASSED\|FAILED\|ERROR\|SKIPPED\|exit\|error vs" $OUT/models*.log $OUT/pipeline.log | cut -c1-200 | tail -40
for f in $OUT/verify-*.log; do echo "$f: $(grep -c ' ok ' $f) ok"; grep -v " ok \| tf32_refused \| infeasible " $f | tail -12; done
