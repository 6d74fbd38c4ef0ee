#!/usr/bin/env bash
# Session 26, call F (one H200), from a snapshot of the working tree. Side by side: the device form of the fast
# division (test_gpu_ops), the driver's GPU name against torch's, the layer norm GPU tests, two model files, and
# verify-chains over the chains of this session's spill fixes and every corpus chain with sigmoid/silu/mish/gelu-tanh.
# Then alone on the card: the deploy's phases against a throw-away PostgreSQL, and direct_main's channel tiles.
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=8
nvidia-smi -L > "$OUT/gpus.txt"
P="-p no:cacheprovider -rfE -m gpu -v"
( export FUSETUNE_CACHE_DIR=/tmp/c1
  timeout 60 python3 -m pytest $P -s tests/test_gpu_ops.py tests/test_deploy_start.py > $OUT/ops-driver.log 2>&1; echo "exit $?" >> $OUT/ops-driver.log
  timeout 100 python3 -m pytest $P -s tests/test_gpu_layer_norm.py > $OUT/layer-norm.log 2>&1; echo "exit $?" >> $OUT/layer-norm.log
  timeout 150 python3 -m pytest $P -s tests/test_optimize.py -k "test_the_fused_chains_run_their_kernels_on_a_gpu and (conv_pools_dilation_divisor or vae_block_conv_in_returned)" > $OUT/models.log 2>&1; echo "exit $?" >> $OUT/models.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c2
  timeout 310 python3 scripts/verify-chains --out $OUT/verify.json $(cat callF_chains.txt) > $OUT/verify.log 2>&1; echo "exit $?" >> $OUT/verify.log ) &
wait
timeout 90 python3 scripts/deploy-timings --runs 5 --importtime > $OUT/deploy-timings.log 2>&1; echo "exit $?" >> $OUT/deploy-timings.log
for ct in 2 4 8; do
  FUSETUNE_CACHE_DIR=/tmp/c3 timeout 45 python3 scripts/profile-kernels tests/chains/conv2d_layernorm_chw_relu_maxpool_fp16.yaml --shape 1024,4,18,22 --set producer.impl=direct --set direct_main.ct=$ct --set direct_main.cells=1 > $OUT/profile-ct$ct.log 2>&1; echo "exit $?" >> $OUT/profile-ct$ct.log
done
grep -h "PASSED\|FAILED\|ERROR\|exit\|error vs\| passed\| failed" $OUT/ops-driver.log $OUT/layer-norm.log $OUT/models.log | cut -c1-160 | tail -30
echo "verify: $(grep -c ' ok ' $OUT/verify.log) ok"; grep -v " ok \| tf32_refused \| infeasible " $OUT/verify.log | tail -12
tail -25 $OUT/deploy-timings.log
grep -h "direct_main\|exit" $OUT/profile-ct*.log | tail -12
