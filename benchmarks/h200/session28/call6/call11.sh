#!/usr/bin/env bash
# Session 28, call 6 (one H200, alone on the card), from HEAD: the conv2d seed (gemm_extrema, whose statistics pass
# now copies its first box early) in float32 and float16, searched (24 and 12 trials) and benched.
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=16 FUSETUNE_CACHE_DIR=/tmp/c9
nvidia-smi -L > "$OUT/gpus.txt"
A=configs/conv2d_groupnorm_scale_maxpool_clamp.yaml; B=benchmarks/half/conv2d_groupnorm_scale_maxpool_clamp_fp16.yaml
timeout 130 python3 -m fusetune search $A --trials 24 > $OUT/search-fp32.log 2>&1; echo "exit $?" >> $OUT/search-fp32.log
timeout 70 python3 -m fusetune bench $A > $OUT/bench-fp32.log 2>&1; echo "exit $?" >> $OUT/bench-fp32.log
timeout 100 python3 -m fusetune search $B --trials 12 > $OUT/search-fp16.log 2>&1; echo "exit $?" >> $OUT/search-fp16.log
timeout 70 python3 -m fusetune bench $B > $OUT/bench-fp16.log 2>&1; echo "exit $?" >> $OUT/bench-fp16.log
for f in bench-fp32 bench-fp16; do tail -n 4 $OUT/$f.log | cut -c1-250; done
