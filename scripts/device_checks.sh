#!/usr/bin/env bash
# The accelerator checks, one script that needs only torch (and numpy, numba): the rejection sampler
# at the published shape (batch 64, k=3, Qwen's vocabulary) against the loops, and the decode-step cost
# of the Qwen3-32B dense and Qwen3-235B-A22B MoE shapes for the rollout simulator, and, where the machine
# has vLLM, which SAM route it runs (method "sam" on vLLM >= 0.34, custom_class on 0.23 to 0.32) and,
# with SAM_CHECK_MODEL=<local model path>, a greedy identity run of SAM against no speculation on it.
# Made for one H200 with torch 2.11, no network, vLLM optional; each part is bounded so the whole stays
# under 8 minutes (the vLLM part: 3 more with a model).
#
#   bash scripts/device_checks.sh [OUT_DIR]          # default results/; writes JSON and CSV there
#   bash scripts/device_checks.sh OUT_DIR --tiny     # CPU, tiny shapes: what the tests run (seconds)
#
# Then: python scripts/simulate_rollout.py --cost OUT_DIR/step_cost_dense.csv --moe-cost OUT_DIR/step_cost_moe_tp4.csv
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results}"
mode="${2:-}"
python="${PYTHON:-python3}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "$mode" = "--tiny" ]; then
  device=cpu
  rejection=(--batch-sizes 2 --draft-lengths 3)
  dense=(--tiny --layers 1 --batches 1,2 --contexts 256 --qs 1,2 --repeats 2 --warmup 1)
  moe=(--tiny --layers 1 --batches 1,2 --contexts 256 --qs 1,2 --repeats 2 --warmup 1)
  limit=(120 120 120 120)
  model=()
elif [ -n "$mode" ]; then
  echo "usage: $0 [OUT_DIR] [--tiny]" >&2
  exit 2
else
  device=cuda
  "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: use --tiny on a CPU")'
  rejection=(--batch-sizes 1 8 64 256 --draft-lengths 3)
  dense=(--layers 4 --batches 1,2,4,8,16,32,64,128,256 --contexts 2048,8192,32768 --qs 1,2,4,5)
  moe=(--tp 4 --layers 4 --batches 1,2,4,8,16,32,64 --contexts 2048,8192,32768 --qs 1,2,4,5)
  limit=(60 200 200 180)
  model=()
  if [ -n "${SAM_CHECK_MODEL:-}" ]; then model=(--model "$SAM_CHECK_MODEL"); fi
fi

echo "[device-checks] rejection sampler, $device -> $out/bench_rejection.json"
timeout "${limit[0]}" "$python" scripts/bench_rejection.py --device "$device" "${rejection[@]}" \
  --json "$out/bench_rejection.json"
echo "[device-checks] dense step cost (Qwen3-32B shape), $device -> $out/step_cost_dense.csv"
timeout "${limit[1]}" "$python" scripts/profile_step_cost.py --device "$device" "${dense[@]}" \
  --out "$out/step_cost_dense.csv"
echo "[device-checks] MoE step cost (Qwen3-235B-A22B shape, TP 4), $device -> $out/step_cost_moe_tp4.csv"
timeout "${limit[2]}" "$python" scripts/profile_step_cost.py --device "$device" --model moe "${moe[@]}" \
  --out "$out/step_cost_moe_tp4.csv"
echo "[device-checks] vLLM route (greedy identity with SAM_CHECK_MODEL) -> $out/vllm_route.json"
timeout "${limit[3]}" "$python" scripts/check_vllm_route.py --json "$out/vllm_route.json" "${model[@]}"
echo "[device-checks] done: $out"
