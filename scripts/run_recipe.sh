#!/usr/bin/env bash
# Shared body of the run_dapo_*.sh scripts: compose, check and launch one recipe config.
#
#   bash scripts/run_recipe.sh RECIPE CONFIG_NAME [--dry-run] [--verbose] [hydra overrides ...]
#
# The console shows one line per training step; everything else goes to the log file named on its
# first line (beside the metrics). --verbose (or SAM_CONSOLE=full) prints everything instead.
#
# Environment:
#   MODEL_PATH        Hugging Face model directory (required; on every node)
#   DATA_DIR          where python -m sam_rollout.verl.data.prepare wrote the parquet files (default ~/data/dapo)
#   TRAIN_FILE        default $DATA_DIR/dapo-math-17k.parquet
#   TEST_FILE         default $DATA_DIR/aime-2024.parquet
#   SAM_LAUNCHER      local (default: run on this Ray head / single node) or ray-job (ray job submit)
#   RAY_ADDRESS       Ray dashboard address for ray-job (default http://127.0.0.1:8265)
#   SAM_TRAINER       core (default: verl.trainer.main_ppo) or dapo-recipe (verl-recipe's main_dapo)
#   VERL_RECIPE_PATH  with dapo-recipe: directory holding a verl-recipe checkout named recipe/
#   SAM_VERL_PYTHON   Python with verl 0.9.1 (default: .venv-verl/bin/python if present, else python3)
#   WANDB_MODE        with trainer.logger='[console,file,wandb]': offline needs no account (wandb sync later)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -lt 2 ]; then
  echo "usage: $0 RECIPE CONFIG_NAME [--dry-run] [--verbose] [overrides ...]" >&2
  exit 2
fi
recipe="$1"; config_name="$2"; shift 2

dry_run=()
verbose=()
overrides=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=(--dry-run) ;;
    --verbose) verbose=(--verbose) ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "error: unknown option $arg (options: --dry-run, --verbose; everything else is a Hydra override)" >&2
        exit 2 ;;
    *) overrides+=("$arg") ;;
  esac
done

if [ -z "${MODEL_PATH:-}" ]; then
  echo "error: set MODEL_PATH to the Hugging Face model directory (e.g. MODEL_PATH=/models/Qwen3-32B)" >&2
  exit 2
fi
data_dir="${DATA_DIR:-$HOME/data/dapo}"
train_file="${TRAIN_FILE:-$data_dir/dapo-math-17k.parquet}"
test_file="${TEST_FILE:-$data_dir/aime-2024.parquet}"

python="${SAM_VERL_PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$repo/.venv-verl/bin/python" ]; then python="$repo/.venv-verl/bin/python"; else python=python3; fi
fi

cd "$repo"
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m sam_rollout.verl.launcher.launch \
  --recipe "$recipe" --config-name "$config_name" --trainer "${SAM_TRAINER:-core}" \
  --launcher "${SAM_LAUNCHER:-local}" "${dry_run[@]}" "${verbose[@]}" -- \
  "actor_rollout_ref.model.path=$MODEL_PATH" "data.train_files=$train_file" "data.val_files=$test_file" \
  "${overrides[@]}"
