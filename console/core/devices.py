"""Which GPU is which trainer device: the one join rule of ``status`` and the screen.

A GPU from nvidia-smi (``Gpu``: index, uuid) is joined to a device of the trainer's newest
``throughput`` record (``device`` such as ``cuda:3``, ``uuid``, ``role``, ``tok_s``, ``busy``):
1. by uuid, when the record gives one;
2. else ``cuda:N`` through run.json's ``CUDA_VISIBLE_DEVICES`` (its N-th entry: a GPU index or uuid);
3. else (no ``CUDA_VISIBLE_DEVICES``) ``cuda:N`` is GPU N.
Trainer devices that match no GPU (the CPU demo's ``cpu``) come after the GPUs, on their own.
"""

from __future__ import annotations

from console.core.events import Gpu


def visible_devices(run: dict | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES from run.json as a list, when it is set and non-empty."""
    env = (run or {}).get("env") or {}
    cvd = env.get("CUDA_VISIBLE_DEVICES") if isinstance(env, dict) else None
    if not isinstance(cvd, str) or not cvd.strip():
        return None
    return [p.strip() for p in cvd.split(",") if p.strip()]


def join_devices(
    gpus: list[Gpu], throughput: dict | None, run: dict | None = None
) -> list[tuple[Gpu | None, dict | None]]:
    """Every GPU in order with its trainer device (or None), then ``(None, device)`` for each device
    of ``throughput`` that matches no GPU. ``run`` is run.json (for CUDA_VISIBLE_DEVICES)."""
    devices = [d for d in (throughput or {}).get("devices") or [] if isinstance(d, dict)]
    by_uuid = {d["uuid"]: d for d in devices if d.get("uuid")}
    by_index: dict[str, dict] = {}
    visible = visible_devices(run)
    for d in devices:
        dev = d.get("device")
        if d.get("uuid") or not isinstance(dev, str) or not dev.startswith("cuda:"):
            continue
        local = dev.split(":", 1)[1]
        if visible is not None:
            if local.isdigit() and int(local) < len(visible):
                by_index[visible[int(local)]] = d
        else:
            by_index[local] = d
    used: set[int] = set()
    out: list[tuple[Gpu | None, dict | None]] = []
    for g in gpus:
        d = by_uuid.get(g.uuid)
        if d is None:
            d = by_index.get(str(g.index)) or by_index.get(g.uuid)
        if d is not None:
            used.add(id(d))
        out.append((g, d))
    out.extend((None, d) for d in devices if id(d) not in used)
    return out
