#!/usr/bin/env bash
# The main job: set up, compile the attention kernel and show its tile IR, the start of its PTX and a piece of its
# machine code under its Python lines, run it through the CPU interpreter against a float64 reference, and, on a
# machine with a CUDA GPU, run it there too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
echo "== tkc compile tkc/kernels/attention.py --emit tile -D D=64 -D CAUSAL=1"
tkc compile tkc/kernels/attention.py --emit tile -D D=64 -D CAUSAL=1
echo "== tkc compile tkc/kernels/attention.py --emit ptx -D D=64 -D CAUSAL=1 --target sm_80 (first 60 lines)"
tkc compile tkc/kernels/attention.py --emit ptx -D D=64 -D CAUSAL=1 --target sm_80 -o /tmp/tkc-demo-attention.ptx
head -60 /tmp/tkc-demo-attention.ptx
echo "... ($(wc -l < /tmp/tkc-demo-attention.ptx) lines in /tmp/tkc-demo-attention.ptx)"
echo "== tkc compile ... --emit sass --target sm_80: ptxas's machine code under its Python lines (at the first exp2)"
if tkc compile tkc/kernels/attention.py --emit sass -D D=64 -D CAUSAL=1 --target sm_80 \
        -o /tmp/tkc-demo-attention.sass 2>/dev/null; then
    grep -m1 -B12 -A4 "MUFU.EX2" /tmp/tkc-demo-attention.sass
else
    echo "(ptxas / nvdisasm not installed: pip install nvidia-cuda-nvcc nvidia-cuda-nvdisasm)"
fi
echo "== interpreting attention_fwd on the CPU (B=1, H=2, N=128, D=64, causal)"
python - <<'PY'
import numpy as np, ml_dtypes
from tkc.kernels import attention_fwd
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 128, 64)).astype(ml_dtypes.bfloat16) for _ in range(3))
o = np.full(q.shape, np.nan, dtype=ml_dtypes.bfloat16)
attention_fwd.interpret(q, k, v, o, 0.125, grid=(2, 2, 1), D=64, CAUSAL=1)  # (Nq / 64 query blocks, H, B)
qf, kf, vf = (x.astype(np.float64) for x in (q, k, v))
s = np.where(np.tril(np.ones((128, 128), bool)), qf @ kf.swapaxes(-1, -2) / 8.0, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True)); ref = (p / p.sum(-1, keepdims=True)) @ vf
err = np.linalg.norm(o.astype(np.float64) - ref) / np.linalg.norm(ref)
print(f"relative error vs float64 reference: {err:.2e}")
assert err < 1e-2
PY
python - <<'PY'
import torch
if not torch.cuda.is_available():
    print("== no CUDA GPU here: the GPU run is skipped")
    raise SystemExit
from tkc.kernels import attention
print(f"== on {torch.cuda.get_device_name()}: tkc.kernels.attention, B=4, H=16, N=4096, D=128, causal")
q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = attention(q, k, v, causal=True)
ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
print(f"relative error vs float32 reference: {((o.float() - ref).norm() / ref.norm()).item():.2e}")
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    attention(q, k, v, causal=True)
end.record(); end.synchronize()
ms = start.elapsed_time(end) / 20
print(f"{ms:.3f} ms per call, {4 * 4 * 16 * 4096**2 * 128 / 2 / ms / 1e9:.0f} TFLOP/s")
PY
