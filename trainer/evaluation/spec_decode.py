"""Block speculative decoding as serving stacks run it, and target-only decoding to compare with.

``speculative_generate(target, proposer, prompt, max_new_tokens, temperature, generator, eos_ids) -> Generation``:

1. target prefill of the prompt (``CachedTarget``: transformers cache; the captured context features of
   every prompt position come out of the same forward) and its first token;
2. the proposer drafts positions ``1 .. block_size - 1`` of a block anchored at the newest token from the
   features of the tokens accepted since its last call (``DrafterProposer``: the real drafter with its own
   context cache; tests pass oracle doubles with the same interface);
3. the target verifies the whole block in one forward over ``[anchor, drafts...]``;
4. ``verify.accept_block`` accepts the longest matching prefix plus the target's own next token (temperature
   0) or runs lossless rejection sampling (temperature > 0); the target's cache is cropped to the accepted
   positions (a hybrid target's linear-attention states: the state the verify forward reached after the last
   accepted position, kept for every position as servers do, ``linear_states.py``; or, ``rewind="replay"``,
   restored from a snapshot taken before the verify forward and advanced again over the accepted tokens, one
   extra forward when a draft was rejected), and their features go to the proposer at the next step.

Each verify step yields ``accepted + 1`` tokens: that count is the step's acceptance length (the reference's
convention: the drafted tokens the target kept, plus the one it adds). Generation stops after
``max_new_tokens`` (the last block may overshoot; its tokens are cut, its acceptance counted) or at an
end-of-sequence token (``eos_ids``; kept, then stop).

``target_generate(target, prompt, ...)``: the target alone, one token per forward, the baseline for the
speed-up and (temperature 0) the output speculative decoding must reproduce token for token.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch

from trainer.evaluation.linear_states import LinearStates, can_record
from trainer.evaluation.load import EvalError
from trainer.evaluation.verify import accept_block

REWIND_MODES = ("states", "replay")
_noted: set[str] = set()


def _note_once(msg: str) -> None:
    if msg not in _noted:
        _noted.add(msg)
        print(f"note: {msg}", file=sys.stderr, flush=True)


@dataclass
class Generation:
    tokens: list[int]  # the new tokens (prompt excluded)
    accept_lens: list[int] = field(default_factory=list)  # per verify step: accepted drafts + 1
    decode_s: float = 0.0  # wall time after the prefill (device synchronised)
    rewind_forwards: int = 0  # extra target forwards to roll linear-attention state back (hybrid targets)
    prefill_s: float = 0.0


class UnsupportedTarget(EvalError):
    """A target whose cache this loop cannot roll back after a rejected block (``error: ...``, exit status 2)."""


class CachedTarget:
    """The target model with its cache: ``prefill``, ``forward_block`` (verify or one decode step), ``crop``.

    ``features`` of a forward are the outputs of decoder layers ``layer_ids`` concatenated (the drafter's
    context features: ``hidden_states[i + 1]``, as in training's capture).

    Attention layers' KV caches are cropped. Linear-attention layers (Qwen3.5 / Qwen3.6 Gated DeltaNet: a conv
    state holding the last few inputs and a recurrent state summing every past token) cannot be cropped: their
    state after a block has absorbed the rejected tokens too. ``crop(n)`` inside the block of the last
    ``forward_block(..., rewindable=True)`` (the verify forward) rolls them back by ``rewind``:

    - ``"states"`` (default): that forward runs the Gated DeltaNet layers through ``linear_states`` (the state
      after every position of the block, kept), and ``crop`` copies in the one after the last kept position: no
      extra forward. Falls back to ``"replay"`` for a target whose linear modules it does not know (said once
      on stderr) and for a block it cannot record (no state yet, longer than ``linear_states.MAX_BLOCK``:
      counted in ``rewind_forwards``);
    - ``"replay"``: that forward first snapshots the states; ``crop`` restores the snapshot, crops the KV caches
      to the block's start and runs the target again over the kept tokens of the block only.

    ``rewind_forwards`` counts the extra forwards (none in ``"states"`` mode, when the whole block is kept or on
    a target without linear-attention layers). Cache layers that can be neither cropped nor rolled back
    (sliding-window attention, which evicts old positions) are refused with ``UnsupportedTarget``."""

    def __init__(self, model, layer_ids: list[int], rewind: str = "states"):
        if rewind not in REWIND_MODES:
            raise ValueError(f"rewind: expected one of {REWIND_MODES}, got {rewind!r}")
        self.model, self.layer_ids, self.rewind = model, list(layer_ids), rewind
        self.device = next(model.parameters()).device
        self.cache = None
        self.len = 0
        self.rewind_forwards = 0
        # of the last verify: ("replay", start, block ids, snapshots) or ("states", start, None, None)
        self._undo = None
        self._states: LinearStates | None = None  # built at the first verify of a hybrid target ("states")
        import inspect

        # transformers renamed the argument (``past_key_values`` -> ``cache``, deprecated from 5.2x)
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in params

    def _new_cache(self):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i, layer in enumerate(cache.layers):
            if getattr(layer, "sliding_window", None):
                raise UnsupportedTarget(
                    f"target cache layer {i} is sliding-window attention ({type(layer).__name__}): it drops old "
                    "positions, so a rejected block cannot be rolled back; speculative evaluation does not "
                    "support such targets"
                )
        return cache

    def _linear_layers(self) -> list:
        """The cache layers holding linear-attention state (transformers' ``LinearAttentionCacheLayerMixin``:
        ``conv_states`` / ``recurrent_states`` dicts keyed by state index, in 5.17 as in 5.24)."""
        if self.cache is None:
            return []
        return [
            ly for ly in self.cache.layers if hasattr(ly, "conv_states") or hasattr(ly, "recurrent_states")
        ]

    def _forward(self, ids: list[int], want_features: bool, logits_last_only: bool = False):
        if self.cache is None:
            self.cache = self._new_cache()
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        pos = torch.arange(self.len, self.len + len(ids), device=self.device).unsqueeze(0)
        extra = {"logits_to_keep": 1} if logits_last_only and self._logits_to_keep else {}
        with torch.no_grad():
            out = self.model(
                input_ids=x,
                position_ids=pos,
                **{self._cache_arg: self.cache},
                use_cache=True,
                output_hidden_states=want_features,
                **extra,
            )
        self.len += len(ids)
        feats = None
        if want_features:
            feats = torch.cat([out.hidden_states[i + 1][0] for i in self.layer_ids], dim=-1)
        return out.logits[0], feats

    def prefill(self, prompt: list[int], want_features: bool = True):
        self.cache, self.len, self._undo = None, 0, None
        return self._forward(list(prompt), want_features)

    def forward_block(self, ids: list[int], want_features: bool = True, rewindable: bool = False):
        """Run ``ids`` after the cached positions. ``rewindable``: ``crop`` may afterwards cut inside this block
        (a hybrid target's linear-attention states: recorded at every position, or snapshotted first)."""
        self._undo = None
        linear = self._linear_layers() if rewindable else []
        if not linear:
            return self._forward(list(ids), want_features)
        rec = self._recorder(linear)
        if rec is not None and can_record(self.cache, rec, len(ids)):
            self._undo = ("states", self.len, None, None)
            with rec.recording(self.cache):
                return self._forward(list(ids), want_features)
        self._undo = ("replay", self.len, list(ids), [_snapshot(ly) for ly in linear])
        return self._forward(list(ids), want_features)

    def _recorder(self, linear: list) -> LinearStates | None:
        """The per-position recorder of this target's Gated DeltaNet layers; None in ``"replay"`` mode or
        where it does not fit the target (then said once)."""
        if self.rewind != "states":
            return None
        if self._states is None:
            self._states = LinearStates(self.model)
            cache_ids = {i for i, ly in enumerate(self.cache.layers) if any(ly is x for x in linear)}
            if self._states.problem is None and self._states.layer_ids() != cache_ids:
                self._states.problem = (
                    f"Gated DeltaNet modules of layers {sorted(self._states.layer_ids())} but linear-attention "
                    f"cache layers {sorted(cache_ids)}"
                )
            if self._states.problem is not None:
                _note_once(
                    f"linear-attention roll-back by replay (one extra target forward per rejected block): "
                    f"{self._states.problem}"
                )
        return None if self._states.problem is not None else self._states

    def crop(self, n: int) -> None:
        """Keep positions ``0 .. n - 1``. KV caches: drop the newest ``len - n`` entries of every layer (by hand:
        the meaning of ``DynamicCache.crop``'s argument changed between transformers 5 releases). Linear-attention
        states: those after position ``n - 1`` of the last rewindable ``forward_block`` (recorded), or back to
        its snapshot and a forward over the kept part of that block (replay)."""
        remove = self.len - n
        if remove < 0:
            raise ValueError(f"cannot crop a cache of {self.len} positions to {n}")
        linear = self._linear_layers()
        undo, self._undo = self._undo, None
        if not remove:
            return
        if not linear:
            self._crop_kv(n)
            return
        if undo is None or n < undo[1]:
            raise ValueError(
                f"cannot crop a hybrid target's cache of {self.len} positions to {n}: linear-attention state "
                "can only go back to the start of the last rewindable forward_block"
            )
        kind, start, ids, snaps = undo
        if kind == "states":
            self._states.select(self.cache, n - start)
            self._crop_kv(n)
            return
        for ly, snap in zip(linear, snaps, strict=True):
            _restore(ly, snap)
        self._crop_kv(start)
        if n > start:
            self._forward(ids[: n - start], want_features=False, logits_last_only=True)
            self.rewind_forwards += 1

    def _crop_kv(self, n: int) -> None:
        remove = self.len - n
        if remove:
            for layer in self.cache.layers:
                keys = getattr(layer, "keys", None)
                if keys is None or not torch.is_tensor(keys) or keys.dim() < 2:
                    continue
                keep = keys.shape[-2] - remove
                layer.keys = keys[..., :keep, :]
                layer.values = layer.values[..., :keep, :]
        self.len = n


def _snapshot(layer) -> dict:
    """Copies of a linear-attention cache layer's states (the single-token decode kernel updates the conv state
    in place, so references would not do)."""
    snap = {}
    for name in ("conv_states", "recurrent_states"):
        states = getattr(layer, name, None) or {}
        snap[name] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in states.items()}
    flags = getattr(layer, "has_previous_state", None)
    snap["has_previous_state"] = dict(flags) if isinstance(flags, dict) else flags
    return snap


def _restore(layer, snap: dict) -> None:
    for name in ("conv_states", "recurrent_states"):
        states = getattr(layer, name, None)
        if states is None:
            continue
        for k, v in snap[name].items():
            cur = states.get(k)
            if torch.is_tensor(cur) and torch.is_tensor(v) and cur.shape == v.shape:
                cur.copy_(v)  # in place: the cache keeps its tensors' addresses (cuda graphs)
            else:
                states[k] = v
    if isinstance(snap["has_previous_state"], dict):
        layer.has_previous_state.update(snap["has_previous_state"])


def _sync(device) -> None:
    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


def _pick(logits: torch.Tensor, temperature: float, generator) -> int:
    if temperature <= 0:
        return int(logits.argmax(-1))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _finish(new: list[int], max_new_tokens: int, eos_ids: set[int]) -> tuple[list[int], bool]:
    """Cut at ``max_new_tokens`` and after the first eos; True when generation is over."""
    for i, t in enumerate(new[:max_new_tokens]):
        if t in eos_ids:
            return new[: i + 1], True
    return new[:max_new_tokens], len(new) >= max_new_tokens


def speculative_generate(
    target: CachedTarget,
    proposer,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    eos_ids: set[int] | frozenset[int] = frozenset(),
) -> Generation:
    if not prompt:
        raise ValueError("empty prompt")
    dev = target.device
    _sync(dev)
    t0 = time.perf_counter()
    logits, feats = target.prefill(prompt)
    seq = list(prompt)
    seq.append(_pick(logits[-1], temperature, generator))
    _sync(dev)
    t1 = time.perf_counter()
    gen = Generation(tokens=[], prefill_s=t1 - t0)
    proposer.reset()
    rewinds0 = target.rewind_forwards
    new_feats = feats
    new, done = _finish(seq[len(prompt) :], max_new_tokens, eos_ids)
    while not done:
        prop = proposer.propose(seq, new_feats, temperature, generator)
        drafts = prop.tokens.view(-1).to(dev)
        start = len(seq) - 1  # the anchor's position; the target's cache holds 0 .. start - 1
        block = [seq[-1], *drafts.tolist()]
        logits, feats = target.forward_block(block, rewindable=True)
        probs = None if prop.probs is None else prop.probs.unsqueeze(0).to(dev)
        n_acc, nxt = accept_block(logits.unsqueeze(0), drafts.unsqueeze(0), probs, temperature, generator)
        n_acc = int(n_acc[0])
        seq.extend(block[1 : 1 + n_acc])
        seq.append(int(nxt[0]))
        target.crop(start + n_acc + 1)  # through the last accepted draft; the new token is the next anchor
        new_feats = feats[: n_acc + 1]
        gen.accept_lens.append(n_acc + 1)
        new, done = _finish(seq[len(prompt) :], max_new_tokens, eos_ids)
    _sync(dev)
    gen.decode_s = time.perf_counter() - t1
    gen.tokens = new
    gen.rewind_forwards = target.rewind_forwards - rewinds0
    return gen


def target_generate(
    target: CachedTarget,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    eos_ids: set[int] | frozenset[int] = frozenset(),
) -> Generation:
    if not prompt:
        raise ValueError("empty prompt")
    dev = target.device
    _sync(dev)
    t0 = time.perf_counter()
    logits, _ = target.prefill(prompt, want_features=False)
    new = [_pick(logits[-1], temperature, generator)]
    _sync(dev)
    t1 = time.perf_counter()
    out, done = _finish(new, max_new_tokens, eos_ids)
    while not done:
        logits, _ = target.forward_block([new[-1]], want_features=False)
        new.append(_pick(logits[-1], temperature, generator))
        out, done = _finish(new, max_new_tokens, eos_ids)
    _sync(dev)
    return Generation(tokens=out, decode_s=time.perf_counter() - t1, prefill_s=t1 - t0)
