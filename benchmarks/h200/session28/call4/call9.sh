#!/usr/bin/env bash
# Session 28, call 4 (one H200): the fp16 conv3d seed's winner profiled from three trees in one call, on one card:
# A = b2b3851 (ft_conv_origin unrolled), B = HEAD (its loads batched, gemm_stats' first box copied early),
# C = HEAD with A's ft_conv_origin (the early copy alone). Builds side by side, then the timings one after another.
set -u
source .device/env.sh
REPO=$PWD
for t in A B C; do mkdir -p /tmp/s$t; done
tar -xf .device/snapA.tar -C /tmp/sA; tar -xf .device/snap.tar -C /tmp/sB; tar -xf .device/snap.tar -C /tmp/sC
cp .device/conv_b2b.cuh.j2 /tmp/sC/templates/conv.cuh.j2
nvidia-smi -L > "$OUT/gpus.txt"
C=benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_fp16.yaml
W="--set producer.impl=gemm_store --set channel_reduce.block=256 --set channel_reduce.vec=4 --set channel_reduce.unroll=4 --set gemm_stats.taps=2 --set gemm_stats.block=256 --set gemm_stats.mt=1 --set gemm_stats.tw=32 --set gemm_stats.th=16 --set gemm_stats.split=4"
run() { (cd /tmp/s$1 && PYTHONPATH="/tmp/site:/tmp/s$1" FUSETUNE_CACHE_DIR=/tmp/c$1 MAX_JOBS=5 timeout 150 python3 scripts/profile-kernels $C $W --vs gemm_stats.th=8 > $OUT/profile-$1-$2.log 2>&1); }
for t in A B C; do run $t warm & done; wait
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $OUT/clocks.txt
for round in 1 2; do for t in A B C; do run $t $round; done; done
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >> $OUT/clocks.txt
cat $OUT/clocks.txt
for f in $OUT/profile-*-[12].log; do echo "== $(basename $f)"; grep -h "ft_\|forward:" $f | cut -c1-40,100-150; done
