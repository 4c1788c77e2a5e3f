#!/usr/bin/env bash
# Set up decode-gap on a fresh Debian/Ubuntu machine with Python >= 3.11:
# system packages (pango for weasyprint, poppler for PDF checks, a compiler for llama.cpp, slurm for the fleet test),
# a virtual environment in .venv, and every Python dependency. Idempotent: a second run only checks.
#
# GPU hosts keep their own CUDA torch: when the system python already imports a CUDA-enabled torch, the venv is
# created with --system-site-packages and torch is not reinstalled (or set DECODE_GAP_KEEP_TORCH=1 to force that).
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
LLAMA_VERSION=0.3.36
WHEEL_CACHE=${DECODE_GAP_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/decode-gap/wheels}
APT_PACKAGES=(
  build-essential cmake pkg-config              # llama-cpp-python compiles llama.cpp at install time
  libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz0b libharfbuzz-subset0 fonts-dejavu-core  # weasyprint
  fonts-liberation   # the charts' font: the PDF draws their labels in the font vl-convert measured them with
  poppler-utils                                 # pdftoppm / pdftotext to look at the rendered report
  chromium                                      # headless: the HTML report as a browser draws it (tests)
  pciutils                                      # lspci for the audit's MaxReadReq / link checks
  slurm-wlm munge                               # the fleet test's one-node SLURM cluster
)

log() { printf '\033[1msetup:\033[0m %s\n' "$*"; }

if command -v apt-get >/dev/null 2>&1; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if ((${#missing[@]})); then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    log "apt packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  log "no apt-get: install the equivalents of ${APT_PACKAGES[*]} yourself"
fi

system_cuda_torch() {
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1
}

if [ ! -x "$VENV/bin/python" ]; then
  if [ "${DECODE_GAP_KEEP_TORCH:-0}" = 1 ] || system_cuda_torch; then
    log "creating $VENV with system site packages (keeps this host's CUDA torch)"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    log "creating $VENV"
    "$PY" -m venv "$VENV"
  fi
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install -U pip setuptools wheel >/dev/null

if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  # The CPU build; a GPU host keeps its own CUDA torch (see above).
  log "installing torch (CPU build)"
  "${PIP[@]}" install "torch==2.13.0"
fi

# llama.cpp is compiled portably: the native build uses instructions (AMX) that crash on some CPUs.
# The wheel is cached under $WHEEL_CACHE so that a second set-up does not compile again.
if ! ls "$WHEEL_CACHE"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  log "building llama-cpp-python $LLAMA_VERSION portably (about 8 minutes on 2 cores)"
  mkdir -p "$WHEEL_CACHE"
  CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "${PIP[@]}" wheel --no-deps --no-cache-dir "llama-cpp-python==$LLAMA_VERSION" -w "$WHEEL_CACHE"
fi

log "installing decode-gap and its Python dependencies"
"${PIP[@]}" install --find-links "$WHEEL_CACHE" -e ".[live,engine,slurm,dev]"
"$VENV/bin/python" -c 'import snakemake, weasyprint, llama_cpp, torch; print("setup: ok: torch", torch.__version__, "llama_cpp", llama_cpp.__version__)'
