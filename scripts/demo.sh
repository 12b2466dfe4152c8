#!/usr/bin/env bash
# The main job: set up, compile the attention kernel and show its tile IR, and run it through the CPU interpreter
# against a float64 reference. (On a machine with a GPU, the GPU run joins here once the runtime lands.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
echo "== tkc compile tkc/kernels/attention.py --emit tile -D D=64 -D CAUSAL=1"
tkc compile tkc/kernels/attention.py --emit tile -D D=64 -D CAUSAL=1
echo "== interpreting attention_fwd on the CPU (B=1, H=2, N=128, D=64, causal)"
python - <<'PY'
import numpy as np, ml_dtypes
from tkc.kernels import attention_fwd
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 128, 64)).astype(ml_dtypes.bfloat16) for _ in range(3))
o = np.full(q.shape, np.nan, dtype=ml_dtypes.bfloat16)
attention_fwd.interpret(q, k, v, o, 0.125, grid=(1, 2, 2), D=64, CAUSAL=1)
qf, kf, vf = (x.astype(np.float64) for x in (q, k, v))
s = np.where(np.tril(np.ones((128, 128), bool)), qf @ kf.swapaxes(-1, -2) / 8.0, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True)); ref = (p / p.sum(-1, keepdims=True)) @ vf
err = np.linalg.norm(o.astype(np.float64) - ref) / np.linalg.norm(ref)
print(f"relative error vs float64 reference: {err:.2e}")
assert err < 1e-2
PY
