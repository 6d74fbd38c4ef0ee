#!/usr/bin/env bash
# Session 27, call 5 (one H200, alone on the card), from HEAD: the spectral bf16 seed with its kept weights' spectrum
# and the conv3d fp16 seed with gemm_stats' taps 2 variants in the search: each searched, then benched (eager,
# torch.compile, max-autotune and the winner in one process).
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=16
nvidia-smi -L > "$OUT/gpus.txt"
B=benchmarks/half/convt3d_scale_batchnorm_gap_bf16.yaml
H=benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_fp16.yaml
export FUSETUNE_CACHE_DIR=/tmp/c1
timeout 60 python3 -m fusetune search $B --trials 4 > $OUT/search-spectral-bf16.log 2>&1; echo "exit $?" >> $OUT/search-spectral-bf16.log
timeout 110 python3 -m fusetune search $H --trials 16 > $OUT/search-conv3d-fp16.log 2>&1; echo "exit $?" >> $OUT/search-conv3d-fp16.log
timeout 90 python3 -m fusetune bench $B > $OUT/bench-spectral-bf16.log 2>&1; echo "exit $?" >> $OUT/bench-spectral-bf16.log
timeout 70 python3 -m fusetune bench $H > $OUT/bench-conv3d-fp16.log 2>&1; echo "exit $?" >> $OUT/bench-conv3d-fp16.log
tail -3 $OUT/search-spectral-bf16.log $OUT/search-conv3d-fp16.log | cut -c1-330
tail -4 $OUT/bench-spectral-bf16.log $OUT/bench-conv3d-fp16.log | cut -c1-250
