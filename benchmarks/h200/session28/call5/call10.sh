#!/usr/bin/env bash
# Session 28, call 5 (one H200, alone on the card), from HEAD: the fp16 and bf16 conv3d seeds searched (24 trials)
# and benched (eager, torch.compile, max-autotune and the winner in one process).
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=16 FUSETUNE_CACHE_DIR=/tmp/c9
nvidia-smi -L > "$OUT/gpus.txt"
for d in fp16 bf16; do
  H=benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_$d.yaml
  timeout 150 python3 -m fusetune search $H --trials 24 > $OUT/search-conv3d-$d.log 2>&1; echo "exit $?" >> $OUT/search-conv3d-$d.log
  timeout 90 python3 -m fusetune bench $H > $OUT/bench-conv3d-$d.log 2>&1; echo "exit $?" >> $OUT/bench-conv3d-$d.log
done
tail -4 $OUT/search-conv3d-*.log | cut -c1-400
tail -4 $OUT/bench-conv3d-*.log | cut -c1-250
