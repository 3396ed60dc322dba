#!/usr/bin/env bash
# Lease runner for the GPU checks: installs the pack of testkit/device_pack.py on a lent machine (no
# network there) and runs named pieces under one deadline. The pack copies this file as its run.sh; run
# that copy, from the repository root, as each call's whole command:
#
#   python -m testkit.device_pack --house DIR --freeze configs/wheelhouse/h200_cuda_image.txt \
#       --python PY312 --out .devpack             # here, first; prints each call's carry list
#   bash .devpack/run.sh stage                    # calls 1..N-1, back to back (the machine stays warm
#                                                 #   30 s): each copies its carried part to /tmp/parts
#   bash .devpack/run.sh main PIECES              # the last call: assemble, check sha256, unpack to
#                                                 #   /tmp/site, run PIECES (default: what the last lease left open)
#
# A part carried by an earlier call may be gone by the next one, hence /tmp/parts. Pieces keep what they
# measured on a timeout; a piece with too little time left is skipped. The default pieces are issue 46's
# (below); the 2026-12-04 lease's open pieces (step_cost, identity, identity_v1, speed_v1, speed_ngram) are
# still there by name. Then, here: python -m benchmarks.gpu_loss_split --table OUT (the loss split's table).
# LEASE_BUDGET (s, default 540) is the deadline of the main call; results land in $OUT.
set -u
pack="$(cd "$(dirname "$0")" && pwd)"
repo="$PWD"
T0=$(date +%s)
OUT="${OUT:-/tmp/out}"
say() { echo "[lease +$(($(date +%s) - T0))s] $*"; }
if [ ! -f "$pack/site.sha256" ]; then
  echo "no site.sha256 beside $0: run the pack's copy (bash .devpack/run.sh), not scripts/device_lease.sh" >&2
  exit 2
fi
mkdir -p "$OUT" /tmp/parts
mode="${1:-main}"
shift || true
cp -n "$pack"/parts/site.part* /tmp/parts/ 2>/dev/null
ls -la /tmp/parts
if [ "$mode" = stage ]; then exit 0; fi
if [ "$mode" != main ]; then
  echo "usage: bash .devpack/run.sh stage | main [PIECES]" >&2
  exit 2
fi
deadline=$((T0 + ${LEASE_BUDGET:-540}))
if [ ! -f /tmp/site/.done ]; then
  cat /tmp/parts/site.part* >/tmp/site.tar.xz
  (cd /tmp && sha256sum -c "$pack/site.sha256") || { say "sha256 mismatch: a part is missing or stale"; exit 3; }
  mkdir -p /tmp/site && xz -T0 -dc /tmp/site.tar.xz | tar -C /tmp/site -xf - && touch /tmp/site/.done
  say "site installed: $(du -sm /tmp/site | cut -f1) MB"
fi
export PYTHONPATH="$repo:/tmp/site" SAM_SHARED_DIR="$pack/shared" PYTHONUNBUFFERED=1
# FlashInfer is not in the pack (testkit/device_pack.py, DROPPED)
export VLLM_USE_FLASHINFER_SAMPLER=0 SAM_MODEL_CACHE=/tmp/smollm2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
py=python3
left() { echo $((deadline - $(date +%s))); }
piece() { # name limit command...
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  [ "$l" -lt "$limit" ] && limit=$l
  if [ "$limit" -lt 20 ]; then say "SKIP $name (no time left)"; return; fi
  say "START $name (limit ${limit}s)"
  timeout -k 10 "$limit" "$@"
  say "END $name rc=$?"
}
# issue 46, in the order a lease should run them: drafts (SAM's device-side drafting on the bare GPU, no
# vLLM: correctness of every step and its cost a step), split (the loss split at 135M, one engine per mode,
# the decisive modes first), split32 (the same at Qwen3-32B's shape, half its layers, dummy weights),
# identity26 (fp32 greedy tokens of the plain V2 and V1 engines, SAM's two routes and ngram)
split_modes="plain_v2_async sam_v2_nodraft sam_v2 plain_v1_sync sam_v1_nodraft plain_v1_async ngram_gpu sam_v1"
split32_modes="plain_v2_async sam_v2_nodraft plain_v1_sync sam_v1_nodraft sam_v2 ngram_gpu"
identity_modes="plain_v2_async plain_v1_sync sam_v2 sam_v1 ngram"
pieces="${*:-facts import convert drafts split split32 identity26}"  # what issue 46 needs first
for p in $pieces; do
  case $p in
    facts) nvidia-smi -L; $py -c 'import torch,sys;print(sys.version.split()[0],torch.__version__,torch.cuda.get_device_name(0))'; lscpu | grep -E "Model name|^CPU\(s\)" ;;
    import) piece import 90 $py "$pack/import_check.py" ;;
    convert) piece convert 90 $py -c 'from testkit.tiny_model import ensure_smollm2; print(ensure_smollm2())' ;;
    identity) piece identity 300 $py -m benchmarks.gpu_engine_checks identity --json "$OUT/engine_identity.json" --model /tmp/smollm2 ;;
    sampled) piece sampled 60 $py -m benchmarks.gpu_engine_checks sampled --json "$OUT/engine_sampled.json" ;;
    rejection) piece rejection 60 $py -m benchmarks.bench_rejection --device cuda --batch-sizes 1 8 64 256 --draft-lengths 3 --json "$OUT/bench_rejection.json" ;;
    speed) piece speed 380 $py -m benchmarks.gpu_engine_checks speed --cuda-graphs --json "$OUT/engine_speed.json" --model /tmp/smollm2 ;;
    speed_ngram) piece speed_ngram 200 $py -m benchmarks.gpu_engine_checks speed --cuda-graphs --speed-settings none,ngram --json "$OUT/engine_speed_ngram.json" --model /tmp/smollm2 ;;
    speed_v1) piece speed_v1 200 $py -m benchmarks.gpu_engine_checks speed --cuda-graphs --v1-runner --speed-settings none,sam_thr8 --json "$OUT/engine_speed_v1.json" --model /tmp/smollm2 ;;
    identity_v1) piece identity_v1 300 $py -m benchmarks.gpu_engine_checks identity --v1-runner --json "$OUT/engine_identity_v1.json" --model /tmp/smollm2 ;;
    speed_eager) piece speed_eager 200 $py -m benchmarks.gpu_engine_checks speed --json "$OUT/engine_speed_eager.json" --model /tmp/smollm2 ;;
    drafts) piece drafts 120 $py -m benchmarks.device_drafts_latency --json "$OUT/device_drafts_latency.json" ;;
    split) for m in $split_modes; do piece "split_$m" 80 $py -m benchmarks.gpu_loss_split "$m" --shape smollm2 --model /tmp/smollm2 --json "$OUT/loss_smollm2_$m.json"; done ;;
    split32) for m in $split32_modes; do piece "split32_$m" 150 $py -m benchmarks.gpu_loss_split "$m" --shape qwen3_32b_half --json "$OUT/loss_qwen3_$m.json"; done ;;
    identity26) for m in $identity_modes; do piece "identity_$m" 60 $py -m benchmarks.gpu_loss_split "$m" --identity --model /tmp/smollm2 --json "$OUT/loss_identity_$m.json"; done ;;
    step_cost) piece step_cost 400 $py -m benchmarks.gpu_engine_checks step_cost --step-layers "${STEP_LAYERS:-16}" --step-ks 0,3 --step-batches 1,8,64 --step-contexts 2048,8192 --json "$OUT/engine_step_cost.json" ;;
    *) say "unknown piece $p" ;;
  esac
done
say "done"
