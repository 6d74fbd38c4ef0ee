#!/usr/bin/env bash
# Session 27, call 4a (one H200), from HEAD: gemm_stats' new variants (taps 2, bregs 0) verified against float64 at
# every shape, then profiled beside the old in one process (scripts/profile-kernels --vs).
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=8
nvidia-smi -L > "$OUT/gpus.txt"
H=benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max
( export FUSETUNE_CACHE_DIR=/tmp/c1
  timeout 200 python3 scripts/verify-chains --out $OUT/taps2.json --set gemm_stats.taps=2 --impl gemm --impl gemm_store --every-shape ${H}_fp16.yaml ${H}_bf16.yaml tests/chains/conv2d_layernorm_chw_relu_maxpool_fp16.yaml > $OUT/taps2.log 2>&1; echo "exit $?" >> $OUT/taps2.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c2
  timeout 200 python3 scripts/verify-chains --out $OUT/bregs0.json --set gemm_stats.taps=2 --set gemm_stats.bregs=0 --set producer.store=half --impl gemm --impl gemm_store --every-shape ${H}_fp16.yaml configs/conv3d_mul_instancenorm_clamp_mul_max.yaml tests/chains/conv2d_layernorm_chw_relu_maxpool_fp16.yaml > $OUT/bregs0.log 2>&1; echo "exit $?" >> $OUT/bregs0.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c5
  sleep 5; timeout 150 python3 scripts/profile-kernels ${H}_fp16.yaml --set producer.impl=gemm_store --vs gemm_stats.taps=2 --vs gemm_stats.taps=2,gemm_stats.bregs=0 --vs gemm_stats.taps=2,gemm_stats.th=16 --vs gemm_stats.taps=2,gemm_stats.bregs=0,gemm_stats.split=16 > $OUT/profile-taps-loaded.log 2>&1 ) &
wait
FUSETUNE_CACHE_DIR=/tmp/c5 timeout 50 python3 scripts/profile-kernels ${H}_fp16.yaml --set producer.impl=gemm_store --vs gemm_stats.taps=2 --vs gemm_stats.taps=2,gemm_stats.bregs=0 --vs gemm_stats.taps=2,gemm_stats.th=16 --vs gemm_stats.taps=2,gemm_stats.bregs=0,gemm_stats.split=16 > $OUT/profile-taps.log 2>&1
FUSETUNE_CACHE_DIR=/tmp/c6 timeout 60 python3 scripts/profile-kernels configs/conv3d_mul_instancenorm_clamp_mul_max.yaml --set producer.impl=gemm_store --set producer.store=half --vs gemm_stats.bregs=0 --vs gemm_stats.bregs=0,gemm_stats.split=16 > $OUT/profile-bregs-fp32.log 2>&1
for f in taps2 bregs0; do echo "$f: $(grep -c ' ok ' $OUT/$f.log) ok"; grep -v " ok \| tf32_refused \| infeasible \|resource_tracker\|warnings.warn" $OUT/$f.log | tail -6; done
grep "ft_gemm_stats\|^conv3d\|Self CUDA" $OUT/profile-taps.log $OUT/profile-bregs-fp32.log | cut -c1-90,170-250
