#!/usr/bin/env bash
# Session 28, call 3 (one H200), from a snapshot of HEAD: the seeds and transposed-convolution norm chains after
# ft_conv_origin's batched loads; the taps choice of gemm_main and gemm_cluster in every world; then, alone on the
# card, profiles: the fp16 conv3d seed's winner (and channel_reduce at unroll 16, an experiment patched into the
# snapshot only), and gemm_main at taps 2 against 1.
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
REPO=$PWD; cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=5
nvidia-smi -L > "$OUT/gpus.txt"
( export FUSETUNE_CACHE_DIR=/tmp/c1
  timeout 330 python3 scripts/verify-chains --out $OUT/pivot.json configs/conv3d_mul_instancenorm_clamp_mul_max.yaml configs/conv2d_groupnorm_scale_maxpool_clamp.yaml benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_fp16.yaml tests/chains/convt2d_gelu_groupnorm.yaml tests/chains/convt3d_silu_groupnorm_hardswish.yaml tests/chains/convt2d_grouped_relu_instancenorm_avgpool.yaml tests/chains/sweep4_half_convt2d_outpad_groupnorm_relu_avgpool_ceil_fp16.yaml > $OUT/pivot.log 2>&1; echo "exit $?" >> $OUT/pivot.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c2
  timeout 330 python3 scripts/verify-chains --every-shape --out $OUT/taps1.json tests/chains/conv2d_fp16_cin3_relu_maxpool.yaml tests/chains/conv3d_bf16_cin3_groupnorm_relu_maxpool.yaml > $OUT/taps1.log 2>&1; echo "exit $?" >> $OUT/taps1.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c3
  timeout 330 python3 scripts/verify-chains --every-shape --set gemm_main.taps=2 --set gemm_cluster.taps=2 --set gemm_stats.taps=2 --impl gemm --impl gemm_cluster --impl gemm_extrema --impl gemm_store --out $OUT/taps2.json tests/chains/conv2d_fp16_cin3_relu_maxpool.yaml tests/chains/conv3d_bf16_cin3_groupnorm_relu_maxpool.yaml tests/chains/sweep4_half_conv2d_maxpool_batchnorm_relu_avgpool_fp16.yaml tests/chains/sweep4_half_conv2d_temb_groupnorm_silu_bf16.yaml benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_fp16.yaml benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_bf16.yaml > $OUT/taps2.log 2>&1; echo "exit $?" >> $OUT/taps2.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c4
  timeout 330 python3 -m pytest -p no:cacheprovider -rfE -m gpu -q tests/test_gpu.py -k "test_inside_kernels_at_seed_shapes" > $OUT/inside.log 2>&1; echo "exit $?" >> $OUT/inside.log ) &
wait
export FUSETUNE_CACHE_DIR=/tmp/c5 MAX_JOBS=16
sed -i 's/unroll: {choices: \[1, 4\], default: 4, compile_time: true, doc: channels per loop step/unroll: {choices: [1, 4, 16], default: 4, compile_time: true, doc: channels per loop step/' templates/channel_reduce.yaml
C=benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_fp16.yaml
W="--set producer.impl=gemm_store --set channel_reduce.block=256 --set channel_reduce.vec=4 --set channel_reduce.unroll=4 --set gemm_stats.taps=2 --set gemm_stats.block=256 --set gemm_stats.mt=1 --set gemm_stats.tw=32 --set gemm_stats.th=16 --set gemm_stats.split=4"
timeout 100 python3 scripts/profile-kernels $C $W --vs channel_reduce.unroll=16 --vs gemm_stats.th=8 > $OUT/profile-seed.log 2>&1; echo "exit $?" >> $OUT/profile-seed.log
timeout 80 python3 scripts/profile-kernels tests/chains/conv2d_fp16_cin3_relu_maxpool.yaml --shape 64,3,224,224 --set producer.impl=gemm --vs gemm_main.taps=2 > $OUT/profile-taps-main.log 2>&1; echo "exit $?" >> $OUT/profile-taps-main.log
timeout 80 python3 scripts/profile-kernels $C --set producer.impl=gemm_cluster --vs gemm_cluster.taps=2 > $OUT/profile-taps-cluster.log 2>&1; echo "exit $?" >> $OUT/profile-taps-cluster.log
grep -h "PASSED\|FAILED\|passed\|failed\|exit" $OUT/*.log | cut -c1-160 | tail -24
for f in pivot taps1 taps2; do echo "$f: $(grep -c ' ok ' $OUT/$f.log) ok"; grep -v " ok \| tf32_refused \| infeasible " $OUT/$f.log | tail -8 | cut -c1-300; done
grep -h "^[a-z0-9_]* \[\|ft_\|forward:" $OUT/profile-*.log | cut -c1-70,100-150
