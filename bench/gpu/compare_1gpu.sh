#!/usr/bin/env bash
# compare's verdicts on one GPU (issue 18): the sweeps of bench/gpu/compare_1gpu.yaml, then compare
# base vs twin and base vs slow for each benchmark. Device kind nvidia-h200, carry .whl from
# ../shared/device/wheels.sh. Results as $OUT/compare_1gpu.tgz (results.csv, compare.csv, logs).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
R=$OUT/compare_1gpu; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
timeout 120 python3 bench/gpu/gqa_probe.py 2>&1 | grep -v Warning | tee $R/gqa_probe.txt
time timeout ${CASES_S:-400} python3 bench/gpu/run_cases.py bench/gpu/compare_1gpu.yaml --out $R 2>&1 | tee $R/run_cases.txt
for b in coll attn; do for c in twin slow; do
  python3 -m sweepbench compare $R/${b}_base $R/${b}_$c -o $R/cmp_${b}_$c 2>&1 | tee $R/cmp_${b}_$c.txt | tail -3; done; done
cd $OUT && find compare_1gpu -name .sweepbench-cache -prune -exec rm -rf {} \; ; find compare_1gpu \( -name "*.parquet" -o -name "*.pt" -o -name "wandb" \) -prune -exec rm -rf {} \; ;
tar czf compare_1gpu.tgz compare_1gpu && rm -rf compare_1gpu && ls -la
