#!/usr/bin/env bash
# Session 28, call 1 (one H200), from a snapshot of HEAD: random chains 22-59 (seed 2026) in every world their
# plans offer; the model files and GPU tests owed (torch.export fallback, centring, kept state, the weights'
# spectrum); the seeds' inside worlds after ft_conv_origin's unrolling; then, alone on the card, kernel profiles of
# the fp16 conv3d seed's winner with the forward timed launched and as a CUDA graph.
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
REPO=$PWD; cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=5
nvidia-smi -L > "$OUT/gpus.txt"
mapfile -t R < <(ls $REPO/.device/rand60/*.yaml | sort)
( export FUSETUNE_CACHE_DIR=/tmp/c1
  timeout 380 python3 scripts/verify-chains --out $OUT/rand-a.json "${R[@]:22:19}" > $OUT/rand-a.log 2>&1; echo "exit $?" >> $OUT/rand-a.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c2
  timeout 380 python3 scripts/verify-chains --out $OUT/rand-b.json "${R[@]:41:19}" > $OUT/rand-b.log 2>&1; echo "exit $?" >> $OUT/rand-b.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c3
  timeout 380 python3 -m pytest -p no:cacheprovider -rfE -m gpu -v -s tests/test_optimize.py tests/test_gpu_weights_spectrum.py -k "test_forwards_across or (test_the_fused_chains_run_their_kernels_on_a_gpu and (inplace_write_on_an_alias or centring_beside_the_returned_output or iadd_alias or sweep4_pixel_shuffle_sr))" > $OUT/models.log 2>&1; echo "exit $?" >> $OUT/models.log ) &
( export FUSETUNE_CACHE_DIR=/tmp/c4
  timeout 380 python3 scripts/verify-chains --out $OUT/seeds.json configs/conv3d_mul_instancenorm_clamp_mul_max.yaml configs/conv2d_groupnorm_scale_maxpool_clamp.yaml benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_fp16.yaml > $OUT/seeds.log 2>&1; echo "exit $?" >> $OUT/seeds.log ) &
wait
export FUSETUNE_CACHE_DIR=/tmp/c5 MAX_JOBS=16
C=benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_fp16.yaml
W="--set producer.impl=gemm_store --set channel_reduce.block=256 --set channel_reduce.vec=4 --set channel_reduce.unroll=4 --set gemm_stats.taps=2 --set gemm_stats.block=256 --set gemm_stats.mt=1 --set gemm_stats.tw=32 --set gemm_stats.th=8 --set gemm_stats.split=4"
timeout 150 python3 scripts/profile-kernels $C $W --vs gemm_stats.th=16 --vs channel_reduce.vec=1 > $OUT/profile-fp16.log 2>&1; echo "exit $?" >> $OUT/profile-fp16.log
grep -h "PASSED\|FAILED\|exit\|error vs" $OUT/*.log | cut -c1-160 | tail -24
for f in rand-a rand-b seeds; do echo "$f: $(grep -c ' ok ' $OUT/$f.log) ok"; grep -v " ok \| tf32_refused \| infeasible " $OUT/$f.log | tail -8 | cut -c1-300; done
grep -h "ft_\|forward:" $OUT/profile-fp16.log | cut -c1-60,100-150
