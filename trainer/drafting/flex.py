"""FlexAttention called safely from inside and outside compiled regions.

Never trace a ``BlockMask`` into a larger compiled graph (a compiled decoder-layer step): on CUDA
(torch 2.11) dynamo kept the first call's mask in such a graph, so later batches ran with stale anchors
and documents (the leak that tests/trainer/test_gpu_model.py caught). Inside a compiled region
:func:`flex_attention` graph-breaks and runs the standalone compiled ``flex_attention``, which takes each
batch's ``BlockMask`` as an input; outside, it calls that directly (compiled on CUDA, eager elsewhere).
"""

from __future__ import annotations

import torch

_COMPILED = None


def flex_attention(q, k, v, block_mask, scale=None):
    """(B, Hq, Q, D) x (B, Hkv, KV, D) -> (B, Hq, Q, D); grouped-query heads when Hq != Hkv."""
    if torch.compiler.is_compiling():
        return _outside(q, k, v, block_mask, scale)
    return _call(q, k, v, block_mask, scale)


@torch.compiler.disable
def _outside(q, k, v, block_mask, scale):
    return _call(q, k, v, block_mask, scale)


def _call(q, k, v, block_mask, scale):
    global _COMPILED
    from torch.nn.attention.flex_attention import flex_attention as flex

    fn = flex
    if q.is_cuda:
        if _COMPILED is None:
            _COMPILED = torch.compile(flex)
        fn = _COMPILED
    return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
