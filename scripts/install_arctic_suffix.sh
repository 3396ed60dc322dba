#!/usr/bin/env bash
# Build and install ONLY the suffix-decoding part of Arctic Inference
# (arctic_inference.suffix_decoding.SuffixDecodingCache: a C++ suffix tree
# bound with nanobind + a small pure-Python wrapper) into a Python environment,
# without torch and without any of Arctic Inference's GPU / vLLM-plugin code.
#
# Usage:
#   scripts/install_arctic_suffix.sh [PYTHON]     # default: <repo>/.venv/bin/python
#   FORCE=1 scripts/install_arctic_suffix.sh ...  # rebuild even if importable
#
# Why not `pip install arctic-inference`?  Its sdist's setup.py does
# `import torch` at top level and its pyproject lists torch>=2.10 as a *build*
# requirement, so even `pip download --no-binary :all:` tries to install torch
# just to read the metadata.  Instead this script fetches the pinned sdist by
# name with `pip download --no-build-isolation` from the target environment,
# which must already hold torch (our environment does), checks its sha256, extracts csrc/suffix_decoding/* and
# arctic_inference/suffix_decoding/*.py, wraps them in a tiny
# scikit-build-core project, builds a wheel in a throwaway build venv (pinned
# build deps; nothing is added to the target env except the resulting wheel
# and, only if missing, numpy) and installs it with --no-deps.
#
# Nothing is written inside the repo: the sdist is cached in
# ${XDG_CACHE_HOME:-~/.cache}/arctic_suffix/, the build happens in a mktemp dir
# that is removed on exit.
set -euo pipefail

# ---- pins -------------------------------------------------------------------
ARCTIC_VERSION="0.3.0"
ARCTIC_SDIST="arctic_inference-${ARCTIC_VERSION}.tar.gz"
ARCTIC_SHA256="7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36"
# Build-only deps (installed into a temporary build venv, never the target).
# nanobind pin matches arctic-inference 0.3.0's own pyproject.
BUILD_REQS=(
  "scikit-build-core==0.11.6"
  "nanobind==2.9.2"
  "packaging==25.0"
  "pathspec==0.12.1"
)
NINJA_PIN="ninja==1.13.0"     # only used if no ninja/make on PATH
CMAKE_PIN="cmake==3.31.6"     # only used if system cmake is missing or < 3.18
# Runtime dep of the wrapper; installed into the target ONLY if missing.
NUMPY_PIN_PY310="numpy==2.2.6"
NUMPY_PIN="numpy==2.3.5"

# ---- helpers ----------------------------------------------------------------
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${1:-${REPO_ROOT}/.venv/bin/python}"

log()  { echo "[install_arctic_suffix] $*"; }
die()  { echo "[install_arctic_suffix] ERROR: $*" >&2; exit 1; }

IMPORT_CHECK='from arctic_inference.suffix_decoding import SuffixDecodingCache as C
c = C(max_tree_depth=24, max_cached_requests=10000)
c.start_request("r", [1, 2, 3, 4, 5, 1, 2, 3])
c.add_active_response("r", [4])
d = c.speculate("r", [1, 2, 3, 4], max_spec_tokens=4, max_spec_factor=1.0, min_token_prob=0.1)
assert list(d.token_ids)[:1] == [5], d.token_ids
c.stop_request("r")'

[ -x "$PY" ] || command -v "$PY" >/dev/null 2>&1 || die "python executable not found: $PY"
PY="$(command -v "$PY" 2>/dev/null || echo "$PY")"

if [ "${FORCE:-0}" != "1" ] && "$PY" -c "$IMPORT_CHECK" >/dev/null 2>&1; then
  log "arctic_inference.suffix_decoding already importable in $PY -- nothing to do (FORCE=1 to rebuild)."
  exit 0
fi

EXISTING="$("$PY" -m pip show arctic-inference 2>/dev/null | sed -n 's/^Version: //p' || true)"
if [ -n "$EXISTING" ] && [[ "$EXISTING" != *suffixonly ]]; then
  die "arctic-inference $EXISTING (full distribution) is already installed in $PY but suffix_decoding does not import; refusing to overwrite it. Uninstall it first."
fi

PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$PYVER" in
  3.10|3.11|3.12|3.13|3.14) ;;
  *) die "Python $PYVER not supported (need >= 3.10; the C++ code is C++20 + nanobind 2.9)";;
esac
command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || die "no C++ compiler (c++/g++) on PATH; need a C++20 compiler (gcc >= 10)"

CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/arctic_suffix"
mkdir -p "$CACHE_DIR"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/arctic_suffix_build.XXXXXX")"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
trap 'echo "[install_arctic_suffix] ERROR: build/install FAILED (line $LINENO). arctic_inference.suffix_decoding was NOT installed into $PY." >&2' ERR

T0=$(date +%s)

# ---- 1. fetch pinned sdist (sha256-verified) --------------------------------
SDIST="$CACHE_DIR/$ARCTIC_SDIST"
sha_ok() { [ -f "$1" ] && echo "$ARCTIC_SHA256  $1" | sha256sum -c --status -; }
if ! sha_ok "$SDIST"; then
  log "downloading $ARCTIC_SDIST"
  "$PY" -c "import torch" 2>/dev/null || die "the sdist's metadata step imports torch: install torch into $PY first"
  DL_DIR="$(mktemp -d)"
  "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation "arctic-inference==${ARCTIC_VERSION}" -d "$DL_DIR" \
    || { rm -rf "$DL_DIR"; die "pip download of arctic-inference==${ARCTIC_VERSION} failed"; }
  cp "$DL_DIR/$ARCTIC_SDIST" "$SDIST.part"
  rm -rf "$DL_DIR"
  mv "$SDIST.part" "$SDIST"
  sha_ok "$SDIST" || { rm -f "$SDIST"; die "sha256 mismatch for $ARCTIC_SDIST"; }
else
  log "using cached $SDIST"
fi

# ---- 2. assemble a minimal suffix-decoding-only project ---------------------
SRC="$WORK/src"
mkdir -p "$SRC"
tar -xzf "$SDIST" -C "$WORK" \
  "arctic_inference-${ARCTIC_VERSION}/csrc/suffix_decoding" \
  "arctic_inference-${ARCTIC_VERSION}/arctic_inference/__init__.py" \
  "arctic_inference-${ARCTIC_VERSION}/arctic_inference/suffix_decoding" \
  "arctic_inference-${ARCTIC_VERSION}/LICENSE"
UP="$WORK/arctic_inference-${ARCTIC_VERSION}"
mkdir -p "$SRC/arctic_inference/suffix_decoding" "$SRC/csrc"
cp "$UP/LICENSE" "$SRC/LICENSE"
cp "$UP/arctic_inference/__init__.py" "$SRC/arctic_inference/__init__.py"
cp "$UP/arctic_inference/suffix_decoding/__init__.py" \
   "$UP/arctic_inference/suffix_decoding/cache.py" \
   "$SRC/arctic_inference/suffix_decoding/"
# simulator.py needs pandas/transformers; ship it anyway (only imported if run).
cp "$UP/arctic_inference/suffix_decoding/simulator.py" "$SRC/arctic_inference/suffix_decoding/" 2>/dev/null || true
cp -r "$UP/csrc/suffix_decoding" "$SRC/csrc/suffix_decoding"

cat > "$SRC/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18...3.31)
project(arctic_suffix_decoding LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
find_package(Python 3.10 COMPONENTS Interpreter Development.Module REQUIRED)
execute_process(
  COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
  OUTPUT_STRIP_TRAILING_WHITESPACE OUTPUT_VARIABLE nanobind_ROOT)
find_package(nanobind CONFIG REQUIRED)
# Same target as upstream csrc/suffix_decoding/CMakeLists.txt
nanobind_add_module(_C NOMINSIZE
  csrc/suffix_decoding/bindings.cc
  csrc/suffix_decoding/suffix_tree.cc)
install(TARGETS _C LIBRARY DESTINATION arctic_inference/suffix_decoding)
EOF

cat > "$SRC/pyproject.toml" <<EOF
[build-system]
requires = ["scikit-build-core==0.11.6", "nanobind==2.9.2"]
build-backend = "scikit_build_core.build"

[project]
name = "arctic-inference"
version = "${ARCTIC_VERSION}+suffixonly"
description = "Arctic Inference ${ARCTIC_VERSION}: suffix decoding only (no torch / GPU / vLLM plugin)"
requires-python = ">=3.10"
dependencies = ["numpy"]
license = { text = "Apache-2.0" }

[tool.scikit-build]
minimum-version = "0.11"
cmake.version = ">=3.18"
cmake.build-type = "Release"
ninja.make-fallback = true
wheel.packages = ["arctic_inference"]
build-dir = "build"
EOF

# ---- 3. throwaway build venv with pinned build deps -------------------------
log "creating build venv (Python $PYVER)"
# If PY is itself a venv, build from its base interpreter (same version/ABI).
BASE_PY="$("$PY" -c 'import sys,os; print(os.path.join(sys.base_exec_prefix, "bin", "python%d.%d" % sys.version_info[:2]))')"
[ -x "$BASE_PY" ] || BASE_PY="$PY"
"$BASE_PY" -m venv "$WORK/buildenv"
BPY="$WORK/buildenv/bin/python"
PIPQ=(--disable-pip-version-check -q)
EXTRA=()
if ! { command -v ninja >/dev/null 2>&1 || command -v make >/dev/null 2>&1; }; then EXTRA+=("$NINJA_PIN"); fi
if ! command -v cmake >/dev/null 2>&1 || ! cmake --version | head -1 | awk '{split($3,v,"."); exit !((v[1]>3)||(v[1]==3&&v[2]>=18))}'; then EXTRA+=("$CMAKE_PIN"); fi
log "installing build deps: ${BUILD_REQS[*]} ${EXTRA[*]:-}"
"$BPY" -m pip install "${PIPQ[@]}" --only-binary :all: "${BUILD_REQS[@]}" ${EXTRA[@]+"${EXTRA[@]}"}
export PATH="$WORK/buildenv/bin:$PATH"

# ---- 4. build the wheel ------------------------------------------------------
log "building wheel (C++ suffix tree via nanobind) ..."
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
if ! "$BPY" -m pip wheel "${PIPQ[@]}" --no-deps --no-build-isolation -w "$WORK/dist" "$SRC" >"$WORK/build.log" 2>&1; then
  cat "$WORK/build.log" >&2
  die "wheel build failed (see log above). arctic_inference.suffix_decoding was NOT installed."
fi
WHEEL="$(ls "$WORK"/dist/arctic_inference-*.whl | head -1)"
log "built $(basename "$WHEEL")"

# ---- 5. install into target --------------------------------------------------
if ! "$PY" -c "import numpy" >/dev/null 2>&1; then
  NP="$NUMPY_PIN"; [ "$PYVER" = "3.10" ] && NP="$NUMPY_PIN_PY310"
  log "numpy missing in target; installing $NP"
  "$PY" -m pip install "${PIPQ[@]}" --only-binary :all: "$NP"
fi
log "installing into $PY (--no-deps)"
"$PY" -m pip install "${PIPQ[@]}" --no-deps --no-index --force-reinstall "$WHEEL"

# ---- 6. verify -------------------------------------------------------------------
if ! "$PY" -c "$IMPORT_CHECK"; then
  die "installed, but 'from arctic_inference.suffix_decoding import SuffixDecodingCache' smoke test failed in $PY"
fi
"$PY" -c "import sys, arctic_inference.suffix_decoding; assert 'torch' not in sys.modules, 'torch was imported'" \
  || die "suffix_decoding import pulled in torch (unexpected)"
log "OK: arctic_inference.suffix_decoding ${ARCTIC_VERSION}+suffixonly installed in $PY ($(( $(date +%s) - T0 ))s)"
