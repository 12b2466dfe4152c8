# Sourced by gpu_check.sh, gpu_session.sh and device_batch.sh: the repository root, $OUT for logs (./gpu-logs by
# default), tkc's wheels installed under /tmp/site where .whl/ has them (a machine without registry access: see
# ../shared/device/fetch-wheels.sh), and the environment to run tkc from this checkout.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/gpu-logs}; mkdir -p "$OUT"; export OUT
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export TKC_CACHE_DIR=${TKC_CACHE_DIR:-/tmp/tkc-cache} PYTHONUNBUFFERED=1
