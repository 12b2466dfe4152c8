import sys, time, statistics, torch
sys.path.insert(0, "bench")
from common import time_ms, graph_time_ms
import tkc.kernels
from tkc.kernels import layernorm, layernorm_kernel
m, d = 16384, 1024
bf = torch.bfloat16
x, r = (torch.randn(m, d, device="cuda", dtype=bf) for _ in range(2))
w = torch.randn(d, device="cuda", dtype=bf)
o, ro = torch.empty_like(x), torch.empty_like(x)
nb = 8 * m * d
def wall(fn, n=300):
    for _ in range(20): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    total = (time.perf_counter() - t) / n * 1e6
    return host, total
calls = {
 "layernorm()": lambda: layernorm(x, r, w, w),
 "layernorm(out=)": lambda: layernorm(x, r, w, w, out=o, residual_out=ro),
 "kernel[grid]": lambda: layernorm_kernel[(m,)](x, r, w, w, o, ro, 1e-5, D=d, WARPS=1),
 "event.record": lambda: torch.cuda.Event(enable_timing=True).record(),
}
for name, fn in calls.items():
    h, t = wall(fn)
    line = f"{name:18s} host {h:6.1f} us/call, with the GPU draining {t:6.1f} us/call"
    if name != "event.record":
        ms = time_ms(fn, 30)
        line += f", time_ms {ms*1e3:6.1f} us ({nb / ms / 1e6:.0f} GB/s), graph {graph_time_ms(fn, 30)*1e3:6.1f} us"
    print(line, flush=True)
import cProfile, pstats
p = cProfile.Profile(); p.enable()
for _ in range(300): layernorm(x, r, w, w)
p.disable(); torch.cuda.synchronize()
pstats.Stats(p).sort_stats("tottime").print_stats(12)
