# Sourced by every device script: $OUT, the carried wheels (.whl) on PYTHONPATH with this checkout's package,
# and NVLink multicast off in NCCL, PyTorch and NVSHMEM (the device README requires it on multi-GPU machines).
OUT=${OUT:-$PWD/devrun/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf /tmp/site  # a warm machine keeps the last call's wheels: one left over can break an import (tokenizers did)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >"$OUT/pip.log" 2>&1 || { echo "wheel install failed"; tail "$OUT/pip.log"; }
export PYTHONPATH=/tmp/site:$PWD/workflow PATH=/tmp/site/bin:$PATH
