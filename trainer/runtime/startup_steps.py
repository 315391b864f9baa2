"""The start-up events of the roles (trainer/run/startup.py has the events and their order): loading the
target with its byte progress, and what the first micro-batch compiles."""

from __future__ import annotations

from trainer.drafting.compiling import compile_enabled


def startup_phase(startup, phase: str, **fields) -> None:
    if startup is not None:
        startup.phase(phase, **fields)


def load_target_events(startup, args, device: str, dtype, layer_ids: list[int]):
    """``load_target`` between ``loading_target`` (with byte progress) and ``target_loaded`` events; a
    ``compiling`` event follows when the target's layer step is compiled (it compiles on its first batch)."""
    return finish_target_events(startup, begin_target_events(startup, args, device, dtype, layer_ids))


def begin_target_events(startup, args, device: str, dtype, layer_ids: list[int]):
    """The ``loading_target`` event and the target's build (``capture.begin_target``): on the thread that
    compiles, before anything compiles beside it. ``finish_target_events`` reads the weights, in any thread."""
    from trainer.target.capture import begin_target
    from trainer.target.loading import weight_files_bytes

    if startup is not None:
        startup.loading(weight_files_bytes(args.target_model))
    return begin_target(
        args.target_model,
        device,
        dtype,
        layer_ids,
        need_final_hidden=args.use_soft_labels,
        target_dtype=getattr(args, "target_dtype", None),
        fp8_scales=getattr(args, "fp8_scales", None),
    )


def finish_target_events(startup, pending):
    from trainer.target.capture import capture_of

    model = pending.finish(progress=startup.progress if startup is not None else None)
    if startup is not None:
        startup.target_loaded(sum(p.numel() * p.element_size() for p in model.parameters()))
        if capture_of(model).compiled:
            startup.phase("compiling", part="target layer step", device=str(pending.device))
    return model


def first_batch_events(startup, device: str) -> None:
    """The drafter got its first micro-batch: on CUDA its first step compiles (layer step, loss chunks)."""
    if startup is not None and str(device).startswith("cuda") and compile_enabled():
        startup.phase("compiling", part="drafter layer step and loss", device=device)
