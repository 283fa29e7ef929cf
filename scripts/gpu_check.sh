#!/usr/bin/env bash
# The GPU check: the benchmark and the forward-cost curve on an NVIDIA GPU, for whoever has one.
#
# With the project installed (`make install`, which takes CUDA torch where nvidia-smi finds a GPU):
#   bash scripts/gpu_check.sh bench    # vanilla, recycling[2.2.2, adaptive, adaptive-fixed, hybrid, hybrid-fixed], hf
#                                      # and pld on the first 4 questions of each task (28), 128 tokens, bf16; then
#                                      # the model's own cost curve with projected speedups (a few minutes)
#   bash scripts/gpu_check.sh profile  # cost curves t(N)/t(1) at Llama 1B and 8B shapes (random weights, bf16), with
#                                      # speedups projected from the mean accepted tokens of `bench`
#   bash scripts/gpu_check.sh vllm     # Token Recycling inside vLLM, where vLLM 0.32 is installed (docs/vllm.md)
#   bash scripts/gpu_check.sh exact    # exact in every dtype: Token Recycling against plain decoding (exact mode on
#                                      # and off) and custom_generate against stock generate, bfloat16, float16 and
#                                      # float32, PER_TASK questions a task (scripts/exactness.py)
#   bash scripts/gpu_check.sh crowd    # many prompts at once (tr_core.batch): 8 and 32 rows, Token Recycling batched
#                                      # against one after another and plain batched, tokens checked identical; then
#                                      # the studio with 30 visitors at once (scripts/crowd.py)
# Each writes JSON and text under $OUT (default /tmp/gpu_check). Settings: MODEL (default the embedded model), DEVICE,
# PER_TASK, MAX_NEW, MINUTES (start no new question after that long), THREADS. A quick try on a CPU:
#   DEVICE=cpu PER_TASK=1 MAX_NEW=16 bash scripts/gpu_check.sh bench
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-${TMPDIR:-/tmp}/gpu_check}; mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda} PER_TASK=${PER_TASK:-4} MAX_NEW=${MAX_NEW:-128}
DATA=bench/data
MODEL_ARGS=(${MODEL:+--model "$MODEL"})

bench() {
  { nvidia-smi -L || true; } 2>/dev/null
  python3 -m tr_core bench --questions "$DATA/spec_bench_dev.jsonl" --questions "$DATA/mbpp_dev.jsonl" \
    "${MODEL_ARGS[@]}" --device "$DEVICE" --per-task "$PER_TASK" --max-new-tokens "$MAX_NEW" \
    --methods vanilla,recycling,hf,pld --template 2.2.2,adaptive,adaptive-fixed,hybrid,hybrid-fixed --no-progress \
    ${MINUTES:+--max-minutes "$MINUTES"} ${THREADS:+--threads "$THREADS"} \
    --json "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/gpu_bench.txt"
  python3 -m tr_core profile "${MODEL_ARGS[@]}" --device "$DEVICE" --repeats 20 ${THREADS:+--threads "$THREADS"} \
    --bench-json "$OUT/gpu_bench.json" --json "$OUT/profile_model.json" 2>&1 | tee "$OUT/profile_model.txt"
}

profile() {
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
  local extra=()
  [ -f "$OUT/gpu_bench.json" ] && extra=(--bench-json "$OUT/gpu_bench.json")
  for cfg in llama-1b llama-8b; do
    python3 -m tr_core profile --config "$cfg" --device cuda --dtype bfloat16 --context 512 --repeats 20 \
      "${extra[@]}" --json "$OUT/profile_$cfg.json" 2>&1 | tee "$OUT/profile_$cfg.txt"
  done
}

# Checks: greedy float32 output identical to plain vLLM alone and batched, sampling and `vllm serve` (tests/vllm);
# the matrix on cuda; tokens/s at 1, 8 and 32 concurrent requests against plain vLLM and ngram.
vllm_check() {
  python3 -c "import vllm, tr_core.vllm; print('vLLM', vllm.__version__)" || { echo "vLLM is not installed" >&2; return 1; }
  VLLM_CPU_KVCACHE_SPACE= python3 -m pytest -q tests/vllm -p no:cacheprovider 2>&1 | tail -n 20 | tee "$OUT/vllm_tests.txt"
  python3 -m tr_core.vllm.bench --questions "$DATA/spec_bench_dev.jsonl" --questions "$DATA/mbpp_dev.jsonl" \
    --per-task 4 --rounds 2 --concurrency 1 8 32 --out "$OUT/vllm_gpu.json" 2>&1 | tail -n 12 | tee "$OUT/vllm_bench.txt"
}

exact() {
  { nvidia-smi -L || true; } 2>/dev/null
  for dtype in bfloat16 float16 float32; do
    python3 scripts/exactness.py "${MODEL_ARGS[@]}" --device "$DEVICE" --dtype "$dtype" --per-task "$PER_TASK" \
      --tokens "$MAX_NEW" --json "$OUT/exact_$dtype.json" 2>&1 | tail -n 40 | tee "$OUT/exact_$dtype.txt"
  done
}

# A class at once: the first turns of PER_TASK questions a task, CONCURRENCY at a time, batched and alone.
crowd() {
  { nvidia-smi -L || true; } 2>/dev/null
  for n in ${CONCURRENCY:-8 32}; do
    python3 -m tr_core bench --questions "$DATA/spec_bench_dev.jsonl" --questions "$DATA/mbpp_dev.jsonl" \
      "${MODEL_ARGS[@]}" --device "$DEVICE" --per-task "$PER_TASK" --max-new-tokens "$MAX_NEW" \
      --template adaptive,hybrid,2.2.2 --concurrency "$n" --no-progress ${THREADS:+--threads "$THREADS"} \
      --json "$OUT/gpu_crowd_$n.json" 2>&1 | tee "$OUT/gpu_crowd_$n.txt"
  done
  # the studio itself: VISITORS (default 30) gradio_client visitors ask at once through the page, each answer then
  # compared with its question answered alone (the app and the comparison both take the GPU's default dtype)
  python3 scripts/crowd.py --visitors "${VISITORS:-30}" --tokens 64 --json "$OUT/gpu_studio_crowd.json" 2>&1 \
    | tail -n 24 | tee "$OUT/gpu_studio_crowd.txt"
}

case "${1:-}" in
  bench) bench ;;
  crowd) crowd ;;
  exact) exact ;;
  profile) profile ;;
  vllm) vllm_check ;;
  *) echo "usage: $0 bench|profile|vllm|crowd|exact (see the header of $0)" >&2; exit 2 ;;
esac
