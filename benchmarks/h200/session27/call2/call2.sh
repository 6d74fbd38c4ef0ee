#!/usr/bin/env bash
# Session 27, call 2 (one H200), from a snapshot of HEAD: random chains (scripts/random-chains, seed
# 2026) in every world each plan offers; the sigmoid/silu/mish/gelu-tanh chains not yet verified after the fast
# division; a search + bench of a returns_producer chain; kernel profiles of the fp16 conv3d seed's winner.
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
REPO=$PWD; cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=8
nvidia-smi -L > "$OUT/gpus.txt"
( export FUSETUNE_CACHE_DIR=/tmp/c1
  timeout 420 python3 scripts/verify-chains --out $OUT/rand.json $REPO/.device/rand60/*.yaml > $OUT/rand.log 2>&1; echo "exit $?" >> $OUT/rand.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c2
  timeout 250 python3 scripts/verify-chains --out $OUT/fastdiv.json tests/chains/conv1d_sigmoid_avgpool_divisor.yaml tests/chains/conv1d_strided_sigmoid_mul_producer_mean.yaml tests/chains/conv2d_add_temb_instancenorm_silu.yaml tests/chains/conv2d_amax_channels_unsqueeze_sigmoid.yaml tests/chains/conv2d_expression_sigmoid_swish_groupnorm_expression_tanh_maxpool.yaml tests/chains/conv2d_groupnorm_noaffine_expression_hardsigmoid_rising_maxpool.yaml tests/chains/conv2d_groupnorm_silu_returns_producer.yaml tests/chains/conv2d_mish_mish.yaml tests/chains/conv2d_wide64_instancenorm_expression_falling_sigmoid_maxpool.yaml tests/chains/convt2d_dilated_mish_adaptiveavgpool_grid.yaml tests/chains/convt2d_expression_offset_swish_instancenorm_expression_powers_avgpool.yaml tests/chains/convt2d_gelu_maxpool_avgpool.yaml tests/chains/convt2d_softmax_channels_bias_scale_sigmoid.yaml tests/chains/convt3d_silu_groupnorm_hardswish.yaml > $OUT/fastdiv.log 2>&1; echo "exit $?" >> $OUT/fastdiv.log
  timeout 240 python3 -m pytest -p no:cacheprovider -rfE -m gpu -v -s tests/test_optimize.py -k "test_the_fused_chains_run_their_kernels_on_a_gpu and (sweep4_pixel_shuffle_sr or sr_upsampler_prelu_leaky or returns_conv_near_misses or early_reader_cut_chain or early_reader_consumed_by_chain or early_reader_no_step_kept)" > $OUT/sr-models.log 2>&1; echo "exit $?" >> $OUT/sr-models.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c3
  C=benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_fp16.yaml
  W="--set producer.impl=gemm_store --set channel_reduce.block=256 --set channel_reduce.vec=4 --set channel_reduce.unroll=4 --set gemm_stats.block=256 --set gemm_stats.mt=1 --set gemm_stats.tw=32 --set gemm_stats.th=8 --set gemm_stats.split=4"
  timeout 90 python3 scripts/profile-kernels $C $W > $OUT/profile-fp16.log 2>&1
  timeout 90 python3 scripts/profile-kernels configs/conv3d_mul_instancenorm_clamp_mul_max.yaml $W --set producer.store=half > $OUT/profile-fp32-half-store.log 2>&1
  timeout 90 python3 scripts/profile-kernels $C --set producer.impl=direct > $OUT/profile-fp16-direct.log 2>&1
  R=benchmarks/corpus/conv2d_groupnorm_silu_returns_producer.yaml
  timeout 150 python3 -m fusetune search $R --trials 12 > $OUT/search-returns-producer.log 2>&1
  timeout 150 python3 -m fusetune bench $R > $OUT/bench-returns-producer.log 2>&1; echo "exit $?" >> $OUT/bench-returns-producer.log ) &
wait
grep -h "PASSED\|FAILED\|exit\|error vs" $OUT/*.log | cut -c1-160 | tail -20
for f in rand fastdiv; do echo "$f: $(grep -c ' ok ' $OUT/$f.log) ok"; grep -v " ok \| tf32_refused \| infeasible " $OUT/$f.log | tail -12; done
tail -5 $OUT/bench-returns-producer.log
