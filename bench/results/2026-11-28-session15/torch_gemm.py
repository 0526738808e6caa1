# PyTorch's cuBLAS GEMMs timed as bench/kernels_bench times ours (3 warm-up
# runs, then 50 runs between CUDA events, the median), on the same shapes and
# the same data (uniform in [-1, 1)): is our cuBLASLt path at the ceiling
# PyTorch reaches on this GPU? One-off, session 15.
import torch

def bench(fn, iters=50):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record(); fn(); b.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in ev)
    return 0.5 * (t[iters // 2 - 1] + t[iters // 2])

def u(*shape):
    return (torch.rand(*shape, device="cuda") * 2 - 1).to(torch.bfloat16)

print("device:", torch.cuda.get_device_name(), "torch", torch.__version__,
      "cuBLAS", torch.backends.cuda.preferred_blas_library())
rows = [  # name, M, N, K: out[M,N] = x[M,K] @ w[N,K]^T
    ("ceiling gemm bf16 8192^3 NT", 8192, 8192, 8192),
    ("llama qkv fwd", 16384, 3072, 2048),
    ("llama w1|w3 fwd", 16384, 16384, 2048),
    ("llama w2 fwd", 16384, 2048, 8192),
    ("gpt2 fc fwd", 65536, 3072, 768),
    ("gpt2 lm_head fwd", 65536, 50304, 768),
]
for name, M, N, K in rows:
    x, w = u(M, K), u(N, K)
    ms = bench(lambda: torch.mm(x, w.t()))
    print(f"{name:32s} {M}x{K}->{N}  torch.mm  {ms:.3f} ms  {2*M*N*K/ms/1e9:.1f} TFLOP/s")
    # backward-shaped: dinp = dout[M,N] @ w[N,K]; dw = dout^T @ x
    g = u(M, N)
    ms = bench(lambda: torch.mm(g, w))
    print(f"{name:32s} bwd dinp  torch.mm  {ms:.3f} ms  {2*M*N*K/ms/1e9:.1f} TFLOP/s")
    ms = bench(lambda: torch.mm(g.t(), x))
    print(f"{name:32s} bwd dw    torch.mm  {ms:.3f} ms  {2*M*N*K/ms/1e9:.1f} TFLOP/s")
    del x, w, g
    torch.cuda.empty_cache()
