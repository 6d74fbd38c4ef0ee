#!/usr/bin/env bash
# Session 26, call G (one H200), from HEAD: after the integer count of var/std, verify-chains over the spread chains
# then the last corpus chains with sigmoid/silu/mish/gelu-tanh; beside it the var/std model file on its kernels.
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=8
nvidia-smi -L > "$OUT/gpus.txt"
( export FUSETUNE_CACHE_DIR=/tmp/c1
  timeout 230 python3 scripts/verify-chains --out $OUT/verify.json tests/chains/conv2d_silu_std_channels.yaml tests/chains/conv2d_mish_var_channels_uncorrected.yaml tests/chains/conv3d_groupnorm_gelu_var_channels_keepdim.yaml tests/chains/conv2d_instancenorm_affine_gelu_std_spatial.yaml tests/chains/conv2d_relu_log_nan_to_num_args_var_channels.yaml tests/chains/conv2d_mish_var_channels_uncorrected.yaml tests/chains/conv2d_same_dilated_silu_groupnorm.yaml tests/chains/conv2d_sigmoid_mul_producer_groupnorm.yaml tests/chains/conv2d_sigmoid_sum_all.yaml tests/chains/conv2d_silu_std_channels.yaml tests/chains/conv2d_wide64_sigmoid_mul_producer_maxpool.yaml tests/chains/conv3d_relu_leakyrelu_gelu_sigmoid_bias.yaml tests/chains/convt2d_dilated_mish_adaptiveavgpool_grid.yaml tests/chains/convt2d_gelu_maxpool_avgpool.yaml tests/chains/convt2d_softmax_channels_bias_scale_sigmoid.yaml tests/chains/convt3d_silu_groupnorm_hardswish.yaml tests/chains/sweep4_half_conv2d_temb_groupnorm_silu_bf16.yaml  > $OUT/verify.log 2>&1; echo "exit $?" >> $OUT/verify.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c2
  timeout 200 python3 -m pytest -p no:cacheprovider -rfE -m gpu -v -s tests/test_optimize.py -k "test_the_fused_chains_run_their_kernels_on_a_gpu and conv2d_instnorm_log_nan_to_num_softmax_dtype_var_std" > $OUT/models.log 2>&1; echo "exit $?" >> $OUT/models.log ) &
wait
grep -h "PASSED\|FAILED\|exit\|error vs" $OUT/models.log | cut -c1-160
echo "verify: $(grep -c ' ok ' $OUT/verify.log) ok"; grep -v " ok \| tf32_refused \| infeasible " $OUT/verify.log | tail -8
awk '{print $1}' $OUT/verify.log | sort -u | head -40
