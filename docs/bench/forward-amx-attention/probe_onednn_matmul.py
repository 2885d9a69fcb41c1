"""Ad-hoc probe: torch's bf16 matmul (oneDNN, AMX where the CPU has it) on one thread, at the shapes of a
prefill's projections. The README's "torch's oneDNN: 0.8-1.3 TFLOP/s a thread" (Xeon, 2026-12-05)."""
import time

import torch

torch.set_num_threads(1)
for M, K, N in [(256, 576, 3072), (1024, 576, 3072), (256, 1536, 576), (1120, 576, 960)]:
    a = torch.randn(M, K).bfloat16()
    b = torch.randn(K, N).bfloat16()
    for _ in range(3):
        a @ b
    t = time.perf_counter()
    n = 50
    for _ in range(n):
        a @ b
    dt = (time.perf_counter() - t) / n
    print(M, K, N, f"{2 * M * K * N / dt / 1e9:.0f} GFLOP/s 1 thread")
