"""Synthetic metrics records and GPU samples for the view-model and screen tests."""

from console.core.events import Gpu, GpuSample

T0 = 1_700_000_000.0


def tp(t, devices, depth=3, cap=8):
    return {"t": t, "kind": "throughput", "devices": devices, "queue": {"depth": depth, "capacity": cap}}


def dev(i, role, tok_s, uuid=True):
    return {
        "device": f"cuda:{i}",
        "uuid": f"GPU-{i}" if uuid else None,
        "role": role,
        "tok_s": tok_s,
        "busy": 0.5,
    }


def step(t, s, total=100, loss=2.0):
    return {
        "t": t,
        "kind": "step",
        "step": s,
        "total_steps": total,
        "epoch": s / 50,
        "loss": loss,
        "acc": [0.9, 0.5, 0.25],
        "accept_len": 1.6,
        "lr": 3e-4,
        "grad_norm": 0.7,
        "tokens": 512,
    }


def gpus(n):
    return GpuSample(
        [
            Gpu(
                i,
                f"GPU-{i}",
                "NVIDIA H200",
                util=10.0 * i,
                mem_used=1024.0 * i,
                mem_total=143771.0,
                power=100.0 + i,
                temp=40.0 + i,
            )
            for i in range(n)
        ]
    )
