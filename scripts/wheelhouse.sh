#!/usr/bin/env bash
# An offline wheelhouse: the wheels an air-gapped machine needs to run SAM with a vLLM release (vLLM, the
# part of its dependency closure the target lacks, this project's wheel), a manifest, and the
# `pip install --no-index` commands for the target. Run it on a machine with internet; the code is
# sam_rollout/wheelhouse.py (its --help says every option).
#
#   bash scripts/wheelhouse.sh --out house --python-version 3.12 --platform manylinux_2_35_x86_64 \
#       --vllm 0.26.0 --freeze configs/wheelhouse/h200_cuda_image.txt [--verl] [--replace NAME ...]
#
# Needs an interpreter of the target's Python version here (python3.12 on PATH, or --python PATH).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m sam_rollout.wheelhouse "$@"
