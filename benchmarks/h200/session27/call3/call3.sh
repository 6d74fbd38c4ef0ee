#!/usr/bin/env bash
# Session 27, call 3 (one H200), from HEAD: the spectral world's kept weights' spectrum (verify, GPU tests, profile),
# random chains (scripts/random-chains --seed 2026, the first 24 of 60) in every world their plans offer, and the
# deploy's time against a database holding its winners (psycopg lookups), alone on the machine at the end.
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
REPO=$PWD; cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=6
nvidia-smi -L > "$OUT/gpus.txt"
P="-p no:cacheprovider -rfE -m gpu -v"
RAND=($(ls $REPO/.device/rand60/*.yaml))
( export FUSETUNE_CACHE_DIR=/tmp/c1
  timeout 150 python3 scripts/verify-chains --out $OUT/spectral.json configs/convt3d_scale_batchnorm_gap.yaml benchmarks/half/convt3d_scale_batchnorm_gap_bf16.yaml > $OUT/spectral.log 2>&1; echo "exit $?" >> $OUT/spectral.log
  timeout 150 python3 -m pytest $P -s tests/test_gpu_weights_spectrum.py > $OUT/weights-spectrum.log 2>&1; echo "exit $?" >> $OUT/weights-spectrum.log
  timeout 120 python3 -m pytest $P tests/test_gpu.py -k "spectral or shared_memory_is_refused" > $OUT/gpu-spectral.log 2>&1; echo "exit $?" >> $OUT/gpu-spectral.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c2
  timeout 340 python3 scripts/verify-chains --job-timeout 100 --out $OUT/rand-a.json "${RAND[@]:0:11}" > $OUT/rand-a.log 2>&1; echo "exit $?" >> $OUT/rand-a.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c3
  timeout 340 python3 scripts/verify-chains --job-timeout 100 --out $OUT/rand-b.json "${RAND[@]:11:11}" > $OUT/rand-b.log 2>&1; echo "exit $?" >> $OUT/rand-b.log ) &
wait
timeout 90 python3 scripts/deploy-timings --runs 5 > $OUT/deploy-timings.log 2>&1; echo "exit $?" >> $OUT/deploy-timings.log
grep -h "PASSED\|FAILED\|exit\|passed\|failed" $OUT/*.log | cut -c1-160 | tail -24
for f in spectral rand-a rand-b; do echo "$f: $(grep -c ' ok ' $OUT/$f.log) ok"; grep -v " ok \| tf32_refused \| infeasible \|resource_tracker\|warnings.warn" $OUT/$f.log | tail -10; done
tail -14 $OUT/deploy-timings.log
