#!/usr/bin/env bash
# Session 28, call 2 (one H200), from a snapshot of HEAD: where the fp16 conv3d seed's statistics pass and
# finalize spend their time, read with Nsight Compute where the runtime lets it read the counters.
set -u
source .device/env.sh
mkdir -p /tmp/snap && tar -xf .device/snap.tar -C /tmp/snap
REPO=$PWD; cd /tmp/snap
export PYTHONPATH="/tmp/site:/tmp/snap" MAX_JOBS=16 FUSETUNE_CACHE_DIR=/tmp/c5
nvidia-smi -L > "$OUT/gpus.txt"
C=benchmarks/half/conv3d_mul_instancenorm_clamp_mul_max_fp16.yaml
W="--set producer.impl=gemm_store --set channel_reduce.block=256 --set channel_reduce.vec=4 --set channel_reduce.unroll=4 --set gemm_stats.taps=2 --set gemm_stats.block=256 --set gemm_stats.mt=1 --set gemm_stats.tw=32 --set gemm_stats.th=16 --set gemm_stats.split=4"
timeout 150 python3 scripts/profile-kernels $C $W --vs gemm_stats.split=16 --vs gemm_stats.split=1 > $OUT/profile.log 2>&1; echo "exit $?" >> $OUT/profile.log
which ncu cuobjdump > $OUT/tools.txt 2>&1; ncu --version >> $OUT/tools.txt 2>&1
timeout 240 ncu --clock-control none -k "regex:gemm_stats|finalize|channel_reduce" -c 3 --import-source no \
  --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters \
  -o $OUT/c3 python3 scripts/profile-kernels $C $W > $OUT/ncu.log 2>&1; echo "exit $?" >> $OUT/ncu.log
if [ -f $OUT/c3.ncu-rep ]; then
  ncu -i $OUT/c3.ncu-rep --page details > $OUT/details.txt 2>&1
  ncu -i $OUT/c3.ncu-rep --page source --print-source sass --csv -k regex:gemm_stats > $OUT/sass-gemm_stats.csv 2>&1
  ncu -i $OUT/c3.ncu-rep --page source --print-source sass --csv -k regex:finalize > $OUT/sass-finalize.csv 2>&1
fi
grep -h "ft_\|forward:" $OUT/profile.log | cut -c1-60,100-150
tail -3 $OUT/ncu.log; cat $OUT/tools.txt
grep -h "Duration\|Stall\|Warp Cycles Per Issued\|Achieved Occupancy\|Registers Per\|Theoretical Occ\|Memory Throughput\|Compute (SM) Th\|Issue Slots Busy\|^  [a-z_]*(" $OUT/details.txt 2>/dev/null | head -60
