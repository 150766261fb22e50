"""Two workloads whose bottleneck is known, for ``hpcml score selftest``.

- ``compute``: back-to-back bf16 matrix multiplies of 8192² (on CUDA): tensor pipes busy,
  DRAM barely (each operand is reused ~8k times).
- ``memory``: streaming copies of a 1 GiB buffer: DRAM busy, no floating-point work.

``python -m hpcml.score.workloads compute --seconds 20 [--device cuda]``; prints the
iterations and the achieved TFLOP/s or GB/s, so a selftest log shows what ran.
"""

from __future__ import annotations

import argparse
import time


def run(kind: str, seconds: float, device: str = "cuda") -> dict:
    import torch
    dev = torch.device(device)
    small = dev.type == "cpu"             # the CPU path only proves the plumbing
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if kind == "compute":
        n = 512 if small else 8192
        dtype = torch.float32 if small else torch.bfloat16
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)

        def step():
            torch.mm(a, b, out=c)
        c = torch.empty(n, n, device=dev, dtype=dtype)
        work, unit = 2 * n ** 3, "TFLOP/s"
    elif kind == "memory":
        n = (16 if small else 256) * 2 ** 20          # float32 elements: 64 MiB or 1 GiB
        x = torch.empty(n, device=dev, dtype=torch.float32).fill_(1.0)
        y = torch.empty_like(x)

        def step():
            y.copy_(x)
        work, unit = 2 * 4 * n, "GB/s"                # read + write
    else:
        raise ValueError(f"unknown workload {kind!r}")
    iters = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            step()
        sync()
        iters += 10
    dt = time.perf_counter() - t0
    rate = work * iters / dt / 1e12 if unit == "TFLOP/s" else work * iters / dt / 1e9
    return {"kind": kind, "device": str(dev), "iterations": iters, "seconds": round(dt, 2),
            "rate": round(rate, 3), "unit": unit}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m hpcml.score.workloads")
    p.add_argument("kind", choices=("compute", "memory"))
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--device", default="cuda")
    r = run(**vars(p.parse_args(argv)))
    print(f"{r['kind']}: {r['iterations']} iterations in {r['seconds']} s on {r['device']}, "
          f"{r['rate']} {r['unit']}", flush=True)


if __name__ == "__main__":
    main()
