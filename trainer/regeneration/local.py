"""In-process generation for a machine with no server: the target decodes batches of prompts with its
transformers cache, as the evaluator's ``CachedTarget`` does for one sequence (trainer/evaluation/spec_decode.py:
the same model loading, cache argument and end-of-sequence ids), greedy or sampled (temperature, top-p).

A batch is left-padded to its longest prompt (attention mask 0 and positions counted from each prompt's own
first token), so every row decodes as it would alone. Hybrid targets (Qwen3.5 / Qwen3.6) batch too: their
linear-attention layers zero the padded positions' inputs (transformers' ``apply_mask_to_padding_states``; the
conv has no bias), so leading pads leave the conv and recurrent states at zero whatever the kernel (a test checks
batched = one at a time). Prompts are grouped by length within a window of ``8 * batch_size`` (less padding);
a window's results are written when it is done, in input order.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from trainer.data.chat import Render
from trainer.evaluation.load import eos_ids_of, load_target_model
from trainer.regeneration.prompt_file import Prompt, Reply

CHECK_EVERY = 8  # decoding steps between two "is every row done?" reads (each one a host-device sync)


@dataclass(frozen=True)
class LocalConfig:
    target_model: str
    device: str = "cpu"
    batch_size: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    thinking: str | None = None
    seed: int = 0


def _pick(logits: torch.Tensor, temperature: float, top_p: float, generator) -> torch.Tensor:
    """(B, V) logits -> (B,) tokens: argmax at temperature 0, else a draw from the top-p nucleus."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # keep the smallest prefix reaching top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).view(-1)


class BatchedTarget:
    def __init__(self, model, eos_ids: set[int], pad_id: int):
        self.model, self.eos, self.pad = model, torch.tensor(sorted(eos_ids)), pad_id
        self.device = next(model.parameters()).device
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in params

    def _forward(self, ids, mask, pos, cache):
        extra = {"logits_to_keep": 1} if self._logits_to_keep else {}
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
            **{self._cache_arg: cache}, **extra,
        )  # fmt: skip
        return out.logits[:, -1]

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new: int, temperature=0.0, top_p=1.0, generator=None):
        """Per prompt: (new tokens up to and including an end-of-sequence token, stopped at one)."""
        from transformers import DynamicCache

        dev, B, L = self.device, len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, L), self.pad, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p) :] = torch.tensor(p)
            mask[i, L - len(p) :] = 1
        ids, mask, eos = ids.to(dev), mask.to(dev), self.eos.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(ids, mask if B > 1 else None, pos, cache)
        out, done = [], torch.zeros(B, dtype=torch.bool, device=dev)
        for _ in range(max_new):
            tok = _pick(logits, temperature, top_p, generator)
            tok = torch.where(done, torch.full_like(tok, self.pad), tok)
            out.append(tok)
            done |= torch.isin(tok, eos)
            # asking the device whether every row is done waits for it: only every CHECK_EVERY steps, so the
            # host queues the next steps' kernels while it works (rows already done only add pads)
            if len(out) == max_new or (len(out) % CHECK_EVERY == 0 and bool(done.all())):
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=dev)], dim=1)
            pos = pos[:, -1:] + 1
            logits = self._forward(tok.view(B, 1), mask if B > 1 else None, pos, cache)
        rows = torch.stack(out, dim=1).tolist() if out else [[] for _ in prompts]
        eos_set = set(self.eos.tolist())
        res = []
        for row in rows:
            cut = next((j for j, t in enumerate(row) if t in eos_set), None)
            res.append((row[: cut + 1], True) if cut is not None else (row, False))
        return res


def render(tok, p: Prompt, thinking: str | None) -> list[int]:
    """The token ids a server would feed the target: the chat template with the generation prompt (and
    ``enable_thinking`` when asked), or the completion prompt."""
    if p.messages is None:
        return list(tok(p.text, add_special_tokens=True)["input_ids"])
    kwargs = {} if thinking is None else {"enable_thinking": thinking == "on"}
    text = Render(kwargs, p.tools or None)(tok, p.messages, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _decode(tok, tokens: list[int], stopped: bool) -> Reply:
    body = tokens[:-1] if stopped else tokens
    return Reply(
        tok.decode(body, skip_special_tokens=True), "stop" if stopped else "length", None, len(tokens)
    )


def local_results(cfg: LocalConfig):
    """The generator of ``driver.regenerate`` for ``cfg`` (loads the target and its tokenizer once)."""
    from transformers import AutoTokenizer

    dtype = torch.bfloat16 if cfg.device.startswith("cuda") else torch.float32
    tok = AutoTokenizer.from_pretrained(cfg.target_model, local_files_only=True)
    model = load_target_model(cfg.target_model, cfg.device, dtype)
    eos = eos_ids_of(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    target, batch = BatchedTarget(model, eos, pad), cfg.batch_size
    gen = torch.Generator(device=target.device).manual_seed(cfg.seed)

    def one_window(window: list[Prompt]):
        ids, errors = {}, {}
        for p in window:
            try:
                got = render(tok, p, cfg.thinking)
                if not got:
                    raise ValueError("the prompt renders to no token")
                ids[p.index] = got
            except Exception as e:  # a template that rejects the conversation: that prompt fails
                errors[p.index] = f"render: {type(e).__name__}: {e}"
        order = sorted(ids, key=lambda i: len(ids[i]))
        results = {}
        for s in range(0, len(order), batch):
            group = order[s : s + batch]
            outs = target.generate([ids[i] for i in group], cfg.max_tokens, cfg.temperature, cfg.top_p, gen)
            results.update({i: _decode(tok, *o) for i, o in zip(group, outs, strict=True)})
        for p in window:
            yield p, results.get(p.index), errors.get(p.index)

    def results(prompts: list[Prompt]):
        w = 8 * batch
        for s in range(0, len(prompts), w):
            yield from one_window(prompts[s : s + w])

    return results
