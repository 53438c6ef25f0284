#!/usr/bin/env bash
# The 2-GPU runs left after x2_wave.sh (docs/results/h200x2/README.md), as named steps so that a few
# device calls on nvidia-h200-x2 take them in order of importance. Each step has its own time limit
# and appends its results to $OUT/w.tar as it ends, so a call cut off still returns what finished;
# no step starts after LEFT seconds (default 480: a call ends at 600 s and the archive must come back).
#   bash bench/gpu/x2_wave2.sh attn12 cp_peer attn_rest collective profile     # call A
#   bash bench/gpu/x2_wave2.sh train megatron_peer                             # call B
#   bash bench/gpu/x2_wave2.sh refit fms                                       # call C
#   CPU=1 OUT=/tmp/w bash bench/gpu/x2_wave2.sh attn12 ...                     # every step tiny, on gloo
# Carry .whl (../shared/device/wheels.sh plus the megatron-core 0.19.2 wheel) and .peers (the
# nccl-tests source: git archive of NVIDIA/nccl-tests into .peers/nccl-tests).
# Steps:
#   attn12         issue 18 section 3's 12-job sweep (its wall time is the target: <= 110 s)
#   attn_rest      GQA-8 16K-128K and MHA 128K, ring / ulysses / torch_cp (issue 20's table)
#   cp_peer        torch CP's standalone twin and the in-harness peer, interleaved, 2 rounds (issue 17 item 3)
#   profile        rank 0's and rank 1's kernel timelines of one fwd+bwd at 16K, W=2 (issue 20)
#   collective     nccl-tests built here, then impl=torch,torch_graph,nccl_tests in one sweep (issue 18)
#   megatron_peer  megatron-core refit twin and in-harness peer at W=2, interleaved, MEG_ROUNDS (2) rounds (issue 17 item 2)
#   train          llama3_8b dp2 and tp2 (selective AC, compile), dp2 with ac=none (issue 17)
#   refit          tp2->tp1 collocated and tp1->tp1 non-collocated, every strategy x both impls (issue 17)
#   fms            experiment=finetune_fms model=llama3_1b tp1,dp2, full and LoRA, compile off and on
# and what the calls of 2026-11-26 (docs/results/h100x2/README.md) did not reach:
#   attn_left      MHA 128K (ring / ulysses / torch_cp), Ulysses at 64K MHA and 128K GQA-8
#   megatron_nc    the megatron peer and twin, tp1->tp1 non-collocated, interleaved (after its fix)
#   refit_left     tp2->tp1 collocated: naive (both impls); megatron's broadcast row
#   refit_moe      the MoE shape: ep2->ep1 (16 layers) and tp2->tp1 (8 layers, both impls)
#   fms_compile    the FMS subset with compile=true
# and attn_left in parts (for x4_wave.sh's streams), and the 4-GPU step:
#   mha128k        MHA 128K, ring / ulysses / torch_cp
#   ulysses_left   Ulysses at 64K MHA and 128K GQA-8 (ring beside it)
#   attn12_fresh   attn12 with launch.preload=false (each rank a fresh interpreter, as before 2026-11-26)
#   refit_moe_bcast  the MoE tp2->tp1 broadcast rows (both impls), which refit_moe's 200 s did not reach
#   t1_parts       ring alone at 16K and 64K MHA: where T1's time goes (phase_s t1_child_start, t1_first_call_*,
#                  t1_reference, t1_reference_save)
#   usp4           W=4 (all four GPUs): usp / ring / ulysses, MHA and GQA-8 at 32K, MHA at 64K (issue 20)
# and for the calls of 2026-11-26 evening:
#   first_call     where a new process's first cuDNN SDPA call goes, fresh and forked after native_libs (issue 18)
#   attn_gqa8      GQA-8 16K-128K, ring / ulysses / torch_cp (attn_rest without its MHA 128K)
#   profile32      profile at 32K, MHA and GQA-8, ring / ulysses / torch_cp: where 32K's efficiency goes (issue 20)
#   attn12_kept    attn12 with launch.keep_ranks=true (each rank's process runs the sweep's jobs in turn)
#   attn32         32K, MHA and GQA-8, ring / ulysses / torch_cp with 20 timed iterations and T1 of 10 (32K's IQR is
#                  8% of its median at 5), kept ranks (issue 20)
#   attn64         attn32 at 64K (GQA-8 64K was 0.942 at 5 iterations, target 0.95), kept ranks (issue 20)
# and for the calls of 2026-11-26 night (4-GPU steps, with usp4):
#   profile4       W=4 (all four GPUs): rank 0's kernel timeline at 32K, MHA and GQA-8, ring / ulysses / usp: where
#                  the W=4 ring's 14% exposed communication at 32K goes (issue 20)
#   attn4_ends     W=4: usp / ring / ulysses at 16K and 128K, MHA (usp4 has 32K and 64K)
#   profile64      profile32 at 64K: where 64K's last points of efficiency go (issue 20)
#   attn16 attn128 attn32 at 16K and 128K: with attn32 and attn64, the W=2 table at 20 timed iterations (issue 20)
#   report         report_2gpu.yaml as run_cases runs it (5 rounds a case), then compare twin and slow (issues 17, 18)
set -u
. bench/gpu/device_env.sh
LEFT=${LEFT:-480}
if [ -z "${CPU:-}" ]; then
  ATT=(benchmark.iters=5 benchmark.warmup=2 benchmark.t1_iters=2); S16=16384; S32=32768; S64=65536; S128=131072
  TINY=(); TW=(); MEG=(); COLL=(benchmark.min_bytes=1048576 benchmark.max_bytes=1073741824 benchmark.dtype=float32)
  NT_DIR=/tmp/nt; MHA=32; GQA=8; I3=ring,ulysses,torch_cp; I4=ring,torch_cp,allgather,ulysses; CPI=torch_cp
else
  ATT=(model=tiny backend=gloo benchmark.dtype=float32 benchmark.iters=2 benchmark.warmup=1 benchmark.t1_iters=1)
  S16=256; S32=512; S64=1024; S128=2048
  TINY=(model=tiny backend=gloo); TW=(--device cpu --heads 8 --head-dim 8 --dtype float32); MEG=(--device cpu --tiny)
  COLL=(benchmark.min_bytes=65536 benchmark.max_bytes=1048576)
  NT_DIR=""; MHA=8; GQA=2; I3=ring,ulysses; I4=ring,allgather,ulysses; CPI=ring  # torch_cp runs on CUDA only
fi
R=$OUT/w; mkdir -p "$R"
keep() { (cd "$OUT" && find w \( -name .sweepbench-cache -o -name "*.parquet" -o -name wandb -o -name "*.pt" -o -name .hydra \) \
            -prune -exec rm -rf {} + 2>/dev/null; tar rf w.tar w && rm -rf w/*); }
sb() { local name=$1 t=$2; shift 2; local t0=$SECONDS
       timeout "$t" python3 -m sweepbench -m "$@" hydra.sweep.dir="$R/$name" > "$R/$name.log" 2>&1
       echo "$name rc=$? $(grep -c ',ok,' "$R/$name/results.csv" 2>/dev/null) ok, wall $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null
  python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version() if torch.cuda.is_available() else 'cpu')"; } > "$R/gpu.txt"
cat "$R/gpu.txt"

step_attn12() {
  sb attn12 200 experiment=attention_llama3 parallelism=cp2 model.num_kv_heads=$MHA "benchmark.seq_len=$S16,$S32,$S64" \
     "benchmark.impl=$I4" "${ATT[@]}"; }
step_attn12_fresh() {
  sb attn12_fresh 240 experiment=attention_llama3 parallelism=cp2 model.num_kv_heads=$MHA "benchmark.seq_len=$S16,$S32,$S64" \
     "benchmark.impl=$I4" "${ATT[@]}" launch.preload=false; }
step_attn12_kept() {
  sb attn12_kept 200 experiment=attention_llama3 parallelism=cp2 model.num_kv_heads=$MHA "benchmark.seq_len=$S16,$S32,$S64" \
     "benchmark.impl=$I4" "${ATT[@]}" launch.keep_ranks=true; }
attn_long() {  # NAME SEQ LIMIT: MHA and GQA-8, ring / ulysses / torch_cp, 20 timed iterations, T1 of 10, kept ranks
  sb "$1" "$3" experiment=attention_llama3 parallelism=cp2 "model.num_kv_heads=$MHA,$GQA" "benchmark.seq_len=$2" \
     "benchmark.impl=$I3" "${ATT[@]}" benchmark.iters=20 benchmark.warmup=3 benchmark.t1_iters=10 launch.keep_ranks=true; }
step_attn32() { attn_long attn32 $S32 170; }
step_attn64() { attn_long attn64 $S64 250; }
step_attn16() { attn_long attn16 $S16 200; }
step_attn128() { attn_long attn128 $S128 400; }
step_t1_parts() {
  sb attn_t1parts 100 experiment=attention_llama3 parallelism=cp2 model.num_kv_heads=$MHA "benchmark.seq_len=$S16,$S64" \
     benchmark.impl=ring "${ATT[@]}"; }
step_attn_rest() { step_attn_gqa8; mha128k 100; }
step_attn_gqa8() {
  sb attn_gqa8 200 experiment=attention_llama3 parallelism=cp2 model.num_kv_heads=$GQA "benchmark.seq_len=$S16,$S32,$S64,$S128" \
     "benchmark.impl=$I3" "${ATT[@]}"; }
mha128k() { sb attn_mha128k "$1" experiment=attention_llama3 parallelism=cp2 model.num_kv_heads=$MHA "benchmark.seq_len=$S128" \
     "benchmark.impl=$I3" "${ATT[@]}"; }
step_cp_peer() {  # twin, harness, twin, harness: both sides see the same drift of the machine
  for r in 1 2; do
    timeout 100 python3 bench/peers/torch_cp.py $S16 $S32 --nproc 2 "${TW[@]}" --warmup 3 --iters 10 \
        --out "$R/torch_cp_twin_r$r.csv" > "$R/torch_cp_twin_r$r.log" 2>&1; echo "torch_cp twin r$r rc=$?" | tee -a "$OUT/steps.txt"
    sb torch_cp_r$r 100 experiment=attention_llama3 parallelism=cp2 model.num_kv_heads=$MHA benchmark.impl=$CPI \
       "benchmark.seq_len=$S16,$S32" "${ATT[@]}" benchmark.iters=10 benchmark.warmup=3
  done; }
prof() {  # NAME NPROC SEQ IMPLS KV LIMIT: rank 0's kernel timelines (profile_attention.py); the traces are large,
          # their summaries come back
  local dev=(); [ -n "${CPU:-}" ] && dev=(--device cpu --heads 8 --head-dim 16 --dtype float32)
  timeout "$6" torchrun --standalone --nproc-per-node "$2" bench/gpu/profile_attention.py --seq-len "$3" --impls "$4" \
      --kv-heads "$5" "${dev[@]}" --out "$R/$1" > "$R/$1.log" 2>&1; echo "$1 rc=$?" | tee -a "$OUT/steps.txt"
  find "$R/$1" -name "*.json.gz" -delete 2>/dev/null; }
step_profile() { prof profile 2 $S16 $I3 $MHA 120; }
step_profile32() { prof profile32 2 $S32 $I3 $MHA,$GQA 150; }
step_profile64() { prof profile64 2 $S64 $I3 $MHA,$GQA 200; }
step_profile4() { prof profile4 4 $S32 ring,ulysses,usp $MHA,$GQA 150; }
step_first_call() {
  local a=(); [ -n "${CPU:-}" ] && { echo "first_call: CUDA only" | tee -a "$OUT/steps.txt"; return; }
  timeout 120 python3 bench/gpu/first_call.py --heads 32 --seqs 8192 16384 --out "$R/first_call.json" > "$R/first_call.log" 2>&1
  echo "first_call rc=$?" | tee -a "$OUT/steps.txt"; }
step_report() {
  local c=(); [ -n "${CPU:-}" ] && c=(--cpu)
  local t0=$SECONDS
  timeout 200 python3 bench/gpu/run_cases.py bench/gpu/report_2gpu.yaml --out "$R/report" "${c[@]}" > "$R/report.log" 2>&1
  echo "report cases rc=$? wall $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
  python3 -m sweepbench compare "$R/report/compare_base" "$R/report/compare_twin" > "$R/compare_twin.txt" 2>&1
  echo "compare twin rc=$?" | tee -a "$OUT/steps.txt"
  python3 -m sweepbench compare "$R/report/compare_base" "$R/report/compare_slow" --fail-on-regression > "$R/compare_slow.txt" 2>&1
  echo "compare slow rc=$? (1 = a regression found)" | tee -a "$OUT/steps.txt"; }
step_collective() {
  local nt=(); impls=torch
  if [ -n "$NT_DIR" ]; then
    wait "$BUILD" 2>/dev/null; echo "nccl-tests build rc=$? ($(tail -n 1 "$OUT/nccl_tests_build.log"))" | tee -a "$OUT/steps.txt"
    nt=(benchmark.nccl_tests_dir=$NT_DIR); impls=torch,torch_graph,nccl_tests
  fi
  sb coll_vs_nccl_tests 150 benchmark=collective parallelism=tp2 "benchmark.ops=[all_reduce,all_gather,reduce_scatter,send_recv]" \
     benchmark.step_factor=4 benchmark.warmup=5 benchmark.iters=20 benchmark.ops_per_sample=20 "benchmark.impl=$impls" \
     "${COLL[@]}" "${nt[@]}" "${TINY[@]}"; }
step_megatron_peer() {  # MEG_CASES: which of the two cases (default both)
  local cases=("tp2->tp1 collocated" "tp1->tp1 non-collocated") harness=("parallelism=tp2 mode=collocated" "parallelism=tp1 mode=non_collocated")
  for r in $(seq "${MEG_ROUNDS:-2}"); do for i in ${MEG_CASES:-0 1}; do
    [ $SECONDS -lt $LEFT ] || return
    timeout 200 torchrun --standalone --nproc-per-node 2 bench/peers/megatron_refit.py "${MEG[@]}" --cases "${cases[$i]}" --iters 20 \
        --out "$R/megatron${i}_twin_r$r.csv" > "$R/megatron${i}_twin_r$r.log" 2>&1; echo "megatron twin $i r$r rc=$?" | tee -a "$OUT/steps.txt"
    sb megatron${i}_r$r 200 experiment=tp2-tp1 benchmark.inference=tp1 benchmark.impl=megatron benchmark.strategy=send_recv \
       benchmark.warmup=2 benchmark.iters=20 ${harness[$i]} "${TINY[@]}"
  done; done; }
step_train() {
  local c=(benchmark.compile=true) s=(benchmark.seq_len=8192 benchmark.warmup=3 benchmark.iters=10)
  [ -n "${CPU:-}" ] && c=(benchmark.compile=false) && s=(benchmark.seq_len=128 benchmark.warmup=1 benchmark.iters=3)
  sb train_8b 360 benchmark=train model=llama3_8b "parallelism=dp2,tp2" benchmark.ac=selective benchmark.precision=bf16 \
     "${c[@]}" "${s[@]}" "${TINY[@]}"
  sb train_8b_ac_none 200 benchmark=train model=llama3_8b parallelism=dp2 benchmark.ac=none benchmark.precision=bf16 \
     "${c[@]}" "${s[@]}" "${TINY[@]}"; }
step_refit() {
  local st=send_recv,pipeline,ipc,broadcast,naive x=(benchmark.iters=10 launch.timeout_s=300)
  [ -n "${CPU:-}" ] && st=send_recv,pipeline,broadcast,naive && x=(benchmark.iters=2 benchmark.warmup=1 benchmark.probe_bytes=65536)
  sb refit_tp2-tp1 200 experiment=tp2-tp1 "benchmark.strategy=$st" "benchmark.impl=sweepbench,megatron" "${x[@]}" "${TINY[@]}"
  sb refit_noncoll_tp1-tp1 200 experiment=tp2-tp1 parallelism=tp1 benchmark.inference=tp1 mode=non_collocated \
     "benchmark.strategy=$st" "benchmark.impl=sweepbench,megatron" "${x[@]}" "${TINY[@]}"; }
fms() {  # NAME COMPILE: the FMS subset (llama3_1b tp1,dp2, full and LoRA) with benchmark.compile=COMPILE
  local x=(); [ -n "${CPU:-}" ] && x=(model=tiny backend=gloo benchmark.seq_len=128 benchmark.micro_batch=1 benchmark.iters=2 benchmark.warmup=1)
  sb "$1" 300 experiment=finetune_fms model=llama3_1b "parallelism=tp1,dp2" "benchmark.lora_rank=0,16" benchmark.ac=none \
     "benchmark.compile=$2" benchmark.dp_shard=fsdp "${x[@]}"; }
step_fms() { fms fms_1b "$([ -n "${CPU:-}" ] && echo false || echo false,true)"; }
step_mha128k() { mha128k 150; }
step_ulysses_left() {
  sb attn_ulysses_mha64k 60 experiment=attention_llama3 parallelism=cp2 model.num_kv_heads=$MHA "benchmark.seq_len=$S64" \
     benchmark.impl=ring,ulysses "${ATT[@]}"
  sb attn_ulysses_gqa128k 100 experiment=attention_llama3 parallelism=cp2 model.num_kv_heads=$GQA "benchmark.seq_len=$S128" \
     benchmark.impl=ring,ulysses "${ATT[@]}"; }
step_attn_left() { step_mha128k; step_ulysses_left; }
step_usp4() {
  sb attn_usp4_32k 150 experiment=attention_llama3 parallelism=cp4 "benchmark.impl=usp,ring,ulysses" "model.num_kv_heads=$MHA,$GQA" \
     "benchmark.seq_len=$S32" "${ATT[@]}"
  sb attn_usp4_mha64k 100 experiment=attention_llama3 parallelism=cp4 "benchmark.impl=usp,ring,ulysses" model.num_kv_heads=$MHA \
     "benchmark.seq_len=$S64" "${ATT[@]}"; }
step_attn4_ends() {
  sb attn_usp4_ends 200 experiment=attention_llama3 parallelism=cp4 "benchmark.impl=usp,ring,ulysses" model.num_kv_heads=$MHA \
     "benchmark.seq_len=$S16,$S128" "${ATT[@]}" launch.keep_ranks=true; }
step_megatron_nc() { MEG_CASES=1 step_megatron_peer; }
step_refit_left() {
  local x=(benchmark.iters=10 launch.timeout_s=300)
  [ -n "${CPU:-}" ] && x=(benchmark.iters=2 benchmark.warmup=1 benchmark.probe_bytes=65536)
  sb refit_tp2-tp1_left 150 experiment=tp2-tp1 "benchmark.strategy=naive" "benchmark.impl=sweepbench,megatron" "${x[@]}" "${TINY[@]}"
  sb refit_tp2-tp1_meg_broadcast 60 experiment=tp2-tp1 benchmark.strategy=broadcast benchmark.impl=megatron "${x[@]}" "${TINY[@]}"; }
step_refit_moe() {  # the MoE preset at sizes 2 GPUs hold (bench/gpu/refit_2gpu.yaml)
  local st=send_recv,pipeline,ipc,broadcast x1=(model.num_layers=16 launch.timeout_s=300) x2=(model.num_layers=8 launch.timeout_s=300)
  if [ -n "${CPU:-}" ]; then st=send_recv,pipeline
    x1=(model=tiny_moe model.num_layers=4 backend=gloo benchmark.iters=2 benchmark.warmup=1 benchmark.probe_bytes=65536); x2=("${x1[@]}"); fi
  sb refit_moe_ep2-ep1 200 experiment=ep2-ep4 benchmark.inference=ep1 "benchmark.strategy=$st" benchmark.iters=10 "${x1[@]}"
  sb refit_moe_tp2-tp1 200 experiment=ep2-ep4 parallelism=tp2 benchmark.inference=tp1 "benchmark.strategy=$st" \
     "benchmark.impl=sweepbench,megatron" benchmark.iters=10 "${x2[@]}"; }
step_refit_moe_bcast() {
  local x2=(model.num_layers=8 launch.timeout_s=300)
  [ -n "${CPU:-}" ] && x2=(model=tiny_moe model.num_layers=4 backend=gloo benchmark.iters=2 benchmark.warmup=1 benchmark.probe_bytes=65536)
  sb refit_moe_tp2-tp1_bcast 120 experiment=ep2-ep4 parallelism=tp2 benchmark.inference=tp1 benchmark.strategy=broadcast \
     "benchmark.impl=sweepbench,megatron" benchmark.iters=10 "${x2[@]}"; }
step_fms_compile() { fms fms_1b_compile true; }

BUILD=""  # nccl-tests builds on the CPUs while the GPU steps before `collective` run
if [ -n "$NT_DIR" ] && [[ " $* " == *" collective "* ]]; then
  PYTHON=python3 JOBS=16 timeout 200 bash bench/peers/build_nccl_tests.sh .peers/nccl-tests "$NT_DIR" > "$OUT/nccl_tests_build.log" 2>&1 &
  BUILD=$!
fi
for s in "$@"; do
  if [ $SECONDS -ge "$LEFT" ]; then echo "$s: not started (${SECONDS} s >= LEFT=$LEFT)" | tee -a "$OUT/steps.txt"; continue; fi
  echo "== $s at ${SECONDS} s"; "step_$s"; keep
done
cd "$OUT" && gzip -f w.tar && ls -la
