#!/usr/bin/env bash
# Session 26, call D (one H200): three processes side by side on the one card: the model files never run on a GPU
# (two halves), and verify-chains over the expression chains and the 32 unverified half chains of .device/h3.
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
cp -r .device/h3 .device/inductor_probe.py /tmp/snap/
cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=8
nvidia-smi -L > "$OUT/gpus.txt"
P="-p no:cacheprovider -rfE -m gpu -v"
T="test_the_fused_chains_run_their_kernels_on_a_gpu"
( export FUSETUNE_CACHE_DIR=/tmp/c1
  timeout 470 python3 -m pytest $P -s tests/test_optimize.py -k "$T and (sweep4_lazy_modules or sweep4_channels_last_model or sweep4_pixel_shuffle_sr or sweep4_identity_pos_embed_quickgelu or sweep4_checkpoint_autocast_no_grad or sweep4_pool_options_indices_near_misses or swin_patch_embed_channels_last)" > $OUT/models1.log 2>&1
  echo "exit $?" >> $OUT/models1.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c2
  timeout 470 python3 -m pytest $P -s tests/test_optimize.py -k "$T and (sweep4_timm_conv2d_same_conv_forward or sweep4_inplace_view_writes or sweep4_patch_embed_tokens or sweep4_kb_conv2d_avgpool_sigmoid_sum_all or sweep4_kb_convt3d_leaky_mul_leaky_maxpool or sweep4_kb_convt3d_maxpool_softmax_sub_swish_max or kb_conv2d_custom_pointwise_forms)" > $OUT/models2.log 2>&1
  echo "exit $?" >> $OUT/models2.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c3
  timeout 400 python3 scripts/verify-chains --out $OUT/verify.json $(ls tests/chains/*expression*.yaml) h3/sweep4_half_conv1d_channel_layernorm_relu_maxpool_padded_bf16.yaml h3/sweep4_half_conv1d_dw40_instancenorm_affine_logsumexp_channels_ieee.yaml h3/sweep4_half_conv1d_dw_same_dilated_instancenorm_gelu_avgpool_ceil_bf16.yaml h3/sweep4_half_conv1d_stride2_batchnorm_relu_maxpool_padded_fp16.yaml h3/sweep4_half_conv2d_add_input_bneval_relu_fp16.yaml h3/sweep4_half_conv2d_dw5_channel_layernorm_gelu_scale_fp16.yaml h3/sweep4_half_conv2d_glu_channels_instancenorm_fp16.yaml h3/sweep4_half_conv2d_layernorm_chw_tanh_fp16.yaml h3/sweep4_half_conv2d_log_softmax_channels_maxpool_fp16.yaml h3/sweep4_half_conv2d_logsumexp_channels_keepdim_relu_bf16.yaml h3/sweep4_half_conv2d_maxpool_batchnorm_relu_avgpool_fp16.yaml h3/sweep4_half_conv2d_maxpool_padded_groupnorm_relu_bf16.yaml h3/sweep4_half_conv2d_mean_spatial_keepdim_sigmoid_bf16.yaml h3/sweep4_half_conv2d_prelu_max_channels_fp16.yaml h3/sweep4_half_conv2d_reflect_relu_normalize_channels_scale_bf16.yaml h3/sweep4_half_conv2d_strided_bneval_hardswish_gap_flatten_bf16.yaml h3/sweep4_half_conv2d_strided_groupnorm_gelu_maxpool_ceil_ieee.yaml h3/sweep4_half_conv2d_wide100_softmax_channels_bf16.yaml h3/sweep4_half_conv2d_wide64_grouped_strided_relu_maxpool_ceil_fp16.yaml h3/sweep4_half_conv3d_avgpool_padded_noinclude_mean_channels_fp16.yaml h3/sweep4_half_conv3d_logsumexp_channels_fp16.yaml h3/sweep4_half_conv3d_same_softmax_channels_amax_spatial_bf16.yaml h3/sweep4_half_conv3d_scalar_scale_sigmoid_mul_input_bf16.yaml h3/sweep4_half_conv3d_wide100_groupnorm_relu_gap_bf16.yaml h3/sweep4_half_convt1d_outpad_batchnorm_tanh_maxpool_fp16.yaml h3/sweep4_half_convt1d_stride3_dilated_layernorm_last_gelu_bf16.yaml h3/sweep4_half_convt2d_dilated_softmax_channels_mean_spatial_fp16.yaml h3/sweep4_half_convt2d_outpad_groupnorm_relu_avgpool_ceil_fp16.yaml h3/sweep4_half_convt2d_wide100_bneval_relu6_adaptiveavgpool_grid_bf16.yaml h3/sweep4_half_convt3d_groupnorm3_silu_mean_channels_keepdim_bf16.yaml h3/sweep4_half_convt3d_outpad_instancenorm_clamp_maxpool_fp16.yaml h3/sweep4_half_convt3d_sum_channels_amax_spatial_fp16.yaml  > $OUT/verify.log 2>&1
  echo "exit $?" >> $OUT/verify.log
  timeout 60 python3 inductor_probe.py benchmarks/convbound/conv2d_64_64_k3_batchnorm_eval_add_relu.yaml > $OUT/probe.log 2>&1
  echo "exit $?" >> $OUT/probe.log ) &
wait
grep -h "PASSED\|FAILED\|ERROR\|SKIPPED\|exit" $OUT/models*.log | cut -c1-200 | tail -30
grep -hv " ok \| tf32_refused \| infeasible " $OUT/verify.log | tail -15; grep -c " ok " $OUT/verify.log
tail -15 $OUT/probe.log
