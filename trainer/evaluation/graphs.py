"""One decoding step captured as a CUDA graph: its kernels launched by one call, not one Python call each.

A small target or drafter on a GPU decodes at the speed of its kernel launches, not of its arithmetic (a
15M-parameter hybrid target: ~30 ms a token through transformers' per-token forward on an H200, for well under
1 ms of device work). Serving stacks capture their decode and verify steps as CUDA graphs; so does this.

``Step(fn, inputs, device)``: ``fn(*inputs)`` (tensors in, a pytree of tensors out) run twice on a side stream
(warm-up: lazy initialisation, the allocator, cuBLAS handles), then captured. ``step()`` replays it and returns
the captured outputs: the same tensors every time, overwritten by the next replay, so a caller reads (or
copies) them before it replays the same step again. The inputs are static too: write into them in place
(``copy_`` / ``fill_``) before ``step()``. The warm-up runs execute ``fn``, so whatever state it writes
(caches) holds garbage afterwards: build the steps before the state is filled. Each step has its own memory
pool, so the outputs of one step survive a replay of another.
"""

from __future__ import annotations

import torch


class Step:
    def __init__(self, fn, inputs: tuple, device: torch.device, warmup: int = 2):
        self.inputs = inputs
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(warmup):
                fn(*inputs)
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.outputs = fn(*inputs)

    def __call__(self):
        self.graph.replay()
        return self.outputs


def try_step(fn, inputs: tuple, device: torch.device, what: str) -> Step | None:
    """``Step(fn, inputs, device)``, or None (said once on stderr, the caller runs ``fn`` eagerly) where this
    torch / device cannot capture it."""
    try:
        return Step(fn, inputs, device)
    except RuntimeError as e:
        import sys

        torch.cuda.synchronize(device)
        print(
            f"note: {what}: no CUDA graph ({str(e).splitlines()[0][:200]}); running it eagerly",
            file=sys.stderr,
        )
        return None
