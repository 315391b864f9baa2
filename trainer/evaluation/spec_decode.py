"""Block speculative decoding as serving stacks run it, and target-only decoding to compare with.

``speculative_generate(target, proposer, prompt, max_new_tokens, temperature, generator, eos_ids) -> Generation``:

1. target prefill of the prompt (``CachedTarget``: transformers KV cache; the captured context features of
   every prompt position come out of the same forward) and its first token;
2. the proposer drafts positions ``1 .. block_size - 1`` of a block anchored at the newest token from the
   features of the tokens accepted since its last call (``DrafterProposer``: the real drafter with its own
   context cache; tests pass oracle doubles with the same interface);
3. the target verifies the whole block in one forward over ``[anchor, drafts...]``;
4. ``verify.accept_block`` accepts the longest matching prefix plus the target's own next token (temperature
   0) or runs lossless rejection sampling (temperature > 0); the target's cache is cropped to the accepted
   positions, and their features go to the proposer at the next step.

Each verify step yields ``accepted + 1`` tokens: that count is the step's acceptance length (the reference's
convention: the drafted tokens the target kept, plus the one it adds). Generation stops after
``max_new_tokens`` (the last block may overshoot; its tokens are cut, its acceptance counted) or at an
end-of-sequence token (``eos_ids``; kept, then stop).

``target_generate(target, prompt, ...)``: the target alone, one token per forward, the baseline for the
speed-up and (temperature 0) the output speculative decoding must reproduce token for token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from trainer.evaluation.verify import accept_block


@dataclass
class Generation:
    tokens: list[int]  # the new tokens (prompt excluded)
    accept_lens: list[int] = field(default_factory=list)  # per verify step: accepted drafts + 1
    decode_s: float = 0.0  # wall time after the prefill (device synchronised)
    prefill_s: float = 0.0


class CachedTarget:
    """The target model with a KV cache: ``prefill``, ``forward_block`` (verify or one decode step), ``crop``.

    ``features`` of a forward are the outputs of decoder layers ``layer_ids`` concatenated (the drafter's
    context features: ``hidden_states[i + 1]``, as in training's capture)."""

    def __init__(self, model, layer_ids: list[int]):
        self.model, self.layer_ids = model, list(layer_ids)
        self.device = next(model.parameters()).device
        self.cache = None
        self.len = 0
        import inspect

        # transformers renamed the argument (``past_key_values`` -> ``cache``, deprecated from 5.2x)
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def _forward(self, ids: list[int], want_features: bool):
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache(config=self.model.config)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        pos = torch.arange(self.len, self.len + len(ids), device=self.device).unsqueeze(0)
        with torch.no_grad():
            out = self.model(
                input_ids=x,
                position_ids=pos,
                **{self._cache_arg: self.cache},
                use_cache=True,
                output_hidden_states=want_features,
            )
        self.len += len(ids)
        feats = None
        if want_features:
            feats = torch.cat([out.hidden_states[i + 1][0] for i in self.layer_ids], dim=-1)
        return out.logits[0], feats

    def prefill(self, prompt: list[int], want_features: bool = True):
        self.cache, self.len = None, 0
        return self._forward(list(prompt), want_features)

    def forward_block(self, ids: list[int], want_features: bool = True):
        return self._forward(list(ids), want_features)

    def crop(self, n: int) -> None:
        """Keep positions ``0 .. n - 1``: drop the newest ``len - n`` entries of every layer (by hand: the
        meaning of ``DynamicCache.crop``'s argument changed between transformers 5 releases)."""
        remove = self.len - n
        if remove < 0:
            raise ValueError(f"cannot crop a cache of {self.len} positions to {n}")
        if remove:
            for layer in self.cache.layers:
                keys = getattr(layer, "keys", None)
                if keys is None or not torch.is_tensor(keys) or keys.dim() < 2:
                    continue
                keep = keys.shape[-2] - remove
                layer.keys = keys[..., :keep, :]
                layer.values = layer.values[..., :keep, :]
        self.len = n


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
    new_feats = feats
    new, done = _finish(seq[len(prompt) :], max_new_tokens, eos_ids)
    while not done:
        prop = proposer.propose(seq, new_feats, temperature, generator)
        drafts = prop.tokens.view(-1).to(dev)
        start = len(seq) - 1  # the anchor's position; the target's cache holds 0 .. start - 1
        block = [seq[-1], *drafts.tolist()]
        logits, feats = target.forward_block(block)
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
