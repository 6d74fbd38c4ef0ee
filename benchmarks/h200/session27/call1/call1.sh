#!/usr/bin/env bash
# For session 27's first call (from a snapshot of HEAD: git archive HEAD > .device/snap.tar): what session 26 landed
# without a GPU run: the pixel_shuffle chains and SR model files, the rest of the sigmoid/silu/mish/gelu-tanh chains
# after the fast division, the layer-norm GPU tests, and a bench of a returns_producer chain (alone on the card).
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=8
nvidia-smi -L > "$OUT/gpus.txt"
P="-p no:cacheprovider -rfE -m gpu -v"
( export FUSETUNE_CACHE_DIR=/tmp/c1
  timeout 200 python3 scripts/verify-chains --out $OUT/shuffle.json -k pixelshuffle > $OUT/shuffle.log 2>&1; echo "exit $?" >> $OUT/shuffle.log
  timeout 200 python3 -m pytest $P -s tests/test_optimize.py -k "test_the_fused_chains_run_their_kernels_on_a_gpu and (sweep4_pixel_shuffle_sr or sr_upsampler_prelu_leaky)" > $OUT/sr-models.log 2>&1; echo "exit $?" >> $OUT/sr-models.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c2
  timeout 400 python3 -m pytest $P -s tests/test_gpu_layer_norm.py > $OUT/layer-norm.log 2>&1; echo "exit $?" >> $OUT/layer-norm.log ) &
wait
FUSETUNE_CACHE_DIR=/tmp/c3 timeout 150 python3 -m fusetune bench tests/chains/conv2d_groupnorm_silu_returns_producer.yaml > $OUT/bench-returns-producer.log 2>&1; echo "exit $?" >> $OUT/bench-returns-producer.log
grep -h "PASSED\|FAILED\|exit\|error vs" $OUT/*.log | cut -c1-160 | tail -30
grep -hv " ok \| tf32_refused \| infeasible " $OUT/shuffle.log | tail -8
