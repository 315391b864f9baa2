"""How much a target's captured hidden states say about the tokens a drafter must draft (issue 35: why DFlash 1
trails on the hybrid target at the first drafted positions).

A drafter drafts the block after an anchor token ``t`` from the target's states at the positions before it
(``t - 1`` and earlier: the anchor's own state is not computed yet) and the anchor's embedding. This tool
measures that input's information with probes, on held-out text, per target and layer set: features = the
chosen layers' states at ``t - 1`` (the hidden state after each layer, as the trainer captures it) and a
one-hot of the anchor ``t``; label = the token a greedy target emits at draft slot ``k`` (its argmax after
``t + k - 1``, with the text's tokens before it: slot 1 is the argmax at ``t``). Two probes a slot: linear
(softmax regression) and an MLP (one hidden layer), trained on the first 75% of the positions (1,500 Adam
steps), scored (top-1 accuracy) on the rest. A baseline with the anchor alone (a bigram) says what the states add.
A third probe, ``mlp_soft``, is the MLP trained on the target's whole distribution at the slot (soft labels, as
the trainer's ``--use-soft-labels``) and scored the same way; ``target`` gives the target's own confidence there
(mean entropy in nats, mean top-1 probability).

``--probes slots,context`` adds (or ``context`` alone runs) the context probes: per captured layer, a linear
probe from that layer's state at ``t - 1`` alone to the token at ``t - k`` (``k`` in ``BACK``): how much of the
text before the anchor a drafter, which sees the context only through these states and reads them first by
linear maps, can take from one position's state.

``--own-text NAME=FILE`` probes that target on its own greedy text instead (a regenerated-text file of
bench_acceptance.py, ``work/regen/regenerated.jsonl``: prompt and completion), as the evaluation decodes it:
each document the prompt's last ``OWN_PROMPT`` bytes and the completion's first ``OWN_NEW``, anchors in the
completion only.

    PYTHONPATH=. python lab/probe_states.py --target dense=bench/out/dense_target:1,5 \\
        --target hybrid=bench/out/hybrid_target:1,5 --target hybrid=bench/out/hybrid_target:3,7 --docs 400
    PYTHONPATH=. python lab/probe_states.py --target dense=bench/out/dense_target:1,5 \\
        --target hybrid=bench/out/hybrid_target:1,5 --own-text dense=bench/out/regen_dense/regenerated.jsonl \\
        --own-text hybrid=bench/out/regen/regenerated.jsonl --docs 600

Targets are bench_acceptance.py's (``--target-from`` folders: a transformers directory or its packed parts).
CPU, fp32; ~2-2.5 min a target at 400 documents of 512 bytes on 2 cores (2026-12-04). Prints one table and writes --out JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import target_transfer  # noqa: E402
from bench.acceptance_target import VOCAB  # noqa: E402
from bench.bench_acceptance import chunks, corpus  # noqa: E402
from trainer.target.capture import capture, load_target  # noqa: E402

SLOTS = (1, 2)
OWN_PROMPT, OWN_NEW = 120, 128  # an own-text document: the prompt's last bytes, the completion's first
MAX_TEXT_BYTES = 64 * 2**20
BACK = (2, 4)  # the context probes' tokens: at t - 2 and t - 4 (t - 1 is the state's own)
PROBES = ("slots", "context")


def parse_target(text: str) -> tuple[str, str, list[int]]:
    """``NAME=DIR:L1,L2`` -> (name, dir, layers)."""
    name, _, rest = text.partition("=")
    path, _, layers = rest.rpartition(":")
    if not name or not path or not layers:
        raise argparse.ArgumentTypeError(f"--target wants NAME=DIR:L1,L2, not {text!r}")
    try:
        ids = [int(x) for x in layers.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--target {text!r}: layers must be integers") from e
    return name, path, ids


def parse_text(text: str) -> tuple[str, str]:
    """``NAME=FILE`` -> (name, file)."""
    name, _, path = text.partition("=")
    if not name or not path:
        raise argparse.ArgumentTypeError(f"--own-text wants NAME=FILE, not {text!r}")
    return name, path


def own_docs(path: str, n: int, seed: int) -> torch.Tensor:
    """(n, OWN_PROMPT + OWN_NEW) documents from a regenerated-text file (JSON lines of ``prompt`` and
    ``completion``), drawn at random (``seed``) among those long enough; SystemExit when there are too few."""
    if os.path.getsize(path) > MAX_TEXT_BYTES:
        raise SystemExit(f"--own-text {path}: larger than {MAX_TEXT_BYTES} bytes")
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    random.Random(seed).shuffle(rows)
    docs = []
    for r in rows:
        p, c = str(r.get("prompt", "")).encode(), str(r.get("completion", "")).encode()
        if len(p) >= OWN_PROMPT and len(c) >= OWN_NEW:
            docs.append(list(p[-OWN_PROMPT:] + c[:OWN_NEW]))
        if len(docs) == n:
            return torch.tensor(docs, dtype=torch.long)
    raise SystemExit(f"--own-text {path}: {len(docs)} documents long enough, {n} asked for")


def states(model_dir: str, docs: torch.Tensor, layers: list[int], who: str = "", batch: int = 16):
    """(the layers' states (D, T, len(layers) * H) as the trainer captures them, the target's next-token
    logits (D, T, V)) in fp32, each row one document (``capture.load_target`` / ``capture.capture``)."""
    try:
        model = load_target(model_dir, "cpu", torch.float32, layers, need_final_hidden=True)
        feats, logits = [], []
        with torch.no_grad():
            for s in range(0, docs.shape[0], batch):
                ids = docs[s : s + batch]
                f, final = capture(model, ids, torch.zeros_like(ids), layers, need_final_hidden=True)
                feats.append(f.float())
                logits.append(model.lm_head(final).float())
    except ValueError as e:  # a layer the target does not have
        raise SystemExit(f"{who or model_dir}: {e}") from None
    return torch.cat(feats), torch.cat(logits)


def samples(feats: torch.Tensor, argmax: torch.Tensor, docs: torch.Tensor, slot: int, first: int = 1):
    """Per anchor t (``first`` <= t, t + slot - 1 < T): (states at t - 1, anchor id t, label = argmax at
    t + slot - 1); ``first`` >= 1."""
    T = docs.shape[1]
    t = torch.arange(first, T - slot + 1)
    x = feats[:, t - 1].reshape(-1, feats.shape[-1])
    return x, docs[:, t].reshape(-1), at_slot(argmax, docs, slot, first)


def at_slot(values: torch.Tensor, docs: torch.Tensor, slot: int, first: int = 1) -> torch.Tensor:
    """``values`` (D, T, ...) at the label positions of ``samples`` (t + slot - 1), flattened as its samples."""
    t = torch.arange(first, docs.shape[1] - slot + 1)
    return values[:, t + slot - 1].reshape(-1, *values.shape[2:])


class Probe(torch.nn.Module):
    """logits = W2 relu(W1 x + E1[anchor]) (``hidden`` > 0) or W x + E[anchor]: the anchor as a one-hot
    concatenated to the states, by lookup; ``x`` None: the anchor alone."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        width = hidden or VOCAB
        self.x = torch.nn.Linear(dim, width) if dim else None
        self.anchor = torch.nn.Embedding(VOCAB, width)
        torch.nn.init.normal_(self.anchor.weight, std=VOCAB**-0.5)  # as a Linear(VOCAB, width) on a one-hot
        self.out = torch.nn.Linear(hidden, VOCAB) if hidden else None

    def forward(self, x, anchor):
        h = self.anchor(anchor) if self.x is None else self.x(x) + self.anchor(anchor)
        return h if self.out is None else self.out(torch.relu(h))


def fit(x, anchor, label, hidden: int, steps: int = 1500, seed: int = 0, soft=None) -> float:
    """Top-1 accuracy (against ``label``) on the last 25% of a probe trained on the first 75% (Adam, lr 3e-3,
    ``steps`` batches of 1,024 drawn with replacement; the states standardised on the training part), trained
    on ``label`` or, given ``soft`` (N, V) probabilities, on those (cross-entropy to the distribution)."""
    g = torch.Generator().manual_seed(seed)
    cut = int(0.75 * label.numel())
    if x is not None:
        mu, sd = x[:cut].mean(0), x[:cut].std(0).clamp(min=1e-6)
        x = (x - mu) / sd
    torch.manual_seed(seed)
    net = Probe(0 if x is None else x.shape[1], hidden)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(steps):
        idx = torch.randint(0, cut, (1024,), generator=g)
        want = label[idx] if soft is None else soft[idx]
        loss = F.cross_entropy(net(None if x is None else x[idx], anchor[idx]), want)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        test = slice(cut, None)
        pred = net(None if x is None else x[test], anchor[test]).argmax(-1)
        return float((pred == label[test]).float().mean())


def context_tokens(
    feats: torch.Tensor, docs: torch.Tensor, layers: list[int], first: int = 1, back: tuple[int, ...] = BACK
) -> dict:
    """{layer: {"t-k": top-1 of a linear probe from the layer's state at t - 1 to the token at t - k}}, anchors
    t from ``first`` (and from max(``back``), so every t - k is in the document); ``k`` in ``back`` (1: the state's
    own token)."""
    H = feats.shape[-1] // len(layers)
    t = torch.arange(max(first, max(back)), docs.shape[1])
    out = {}
    for i, layer in enumerate(layers):
        x = feats[:, t - 1, i * H : (i + 1) * H].reshape(-1, H)
        no_anchor = torch.zeros(x.shape[0], dtype=torch.long)
        out[str(layer)] = {
            f"t-{k}": fit(x, no_anchor, docs[:, t - k].reshape(-1), 0, steps=800) for k in back
        }
    return out


def probe_target(
    name: str,
    path: str,
    layers: list[int],
    docs: torch.Tensor,
    hidden: int,
    first: int = 1,
    probes: tuple[str, ...] = ("slots",),
    back: tuple[int, ...] = BACK,
) -> dict:
    """One ``--target``'s row on ``docs`` (anchors from position ``first``: an own text's completion)."""
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        dest = os.path.join(tmp, "target")
        try:
            target_transfer.fetch_target(path, dest)
        except target_transfer.TransferError as e:
            raise SystemExit(f"--target {name}: {e}") from None
        feats, logits = states(dest, docs, layers, f"--target {name}={path}")
    argmax, probs = logits.argmax(-1), logits.softmax(-1)
    next_acc = float((argmax[:, first - 1 : -1] == docs[:, first:]).float().mean())
    row = {"target": name, "dir": path, "layers": layers, "next_token_accuracy": next_acc, "slots": {}}
    if "context" in probes:
        row["context"] = context_tokens(feats, docs, layers, first, back)
    for slot in SLOTS if "slots" in probes else ():
        x, anchor, label = samples(feats, argmax, docs, slot, first)
        p = at_slot(probs, docs, slot, first)
        row["slots"][slot] = {
            "anchor_only": fit(None, anchor, label, 0),
            "linear": fit(x, anchor, label, 0),
            "mlp": fit(x, anchor, label, hidden),
            "mlp_soft": fit(x, anchor, label, hidden, soft=p),
            "target": {
                "entropy_nats": float(-(p * p.clamp(min=1e-30).log()).sum(-1).mean()),
                "top1_p": float(p.max(-1).values.mean()),
            },  # fmt: skip
        }
    row["seconds"] = round(time.time() - t0, 1)
    return row


def _back(text: str) -> tuple[int, ...]:
    try:
        back = tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers >= 1, not {text!r}") from None
    if not back or min(back) < 1:
        raise argparse.ArgumentTypeError(f"comma-separated integers >= 1, not {text!r}")
    return back


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=parse_target, action="append", required=True, help="NAME=DIR:L1,L2")
    p.add_argument("--docs", type=int, default=400, help="held-out documents of 512 bytes")
    p.add_argument("--seed", type=int, default=7, help="which held-out chunks (not the evaluation's prompts)")
    p.add_argument("--hidden", type=int, default=256, help="the MLP probe's width")
    p.add_argument(
        "--own-text", type=parse_text, action="append", default=[], help="NAME=FILE (module docstring)"
    )
    p.add_argument("--probes", default="slots", help="comma-separated: slots, context (module docstring)")
    p.add_argument(
        "--back",
        type=_back,
        default=BACK,
        help="the context probes' tokens before the anchor, e.g. 1,2,3 (1: own)",
    )
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    probes = tuple(x for x in a.probes.split(",") if x)
    if not probes or set(probes) - set(PROBES):
        p.error(f"--probes: one or more of {', '.join(PROBES)}, not {a.probes!r}")
    own = dict(a.own_text)
    if unknown := set(own) - {n for n, _, _ in a.target}:
        p.error(f"--own-text for no --target: {', '.join(sorted(unknown))}")
    _, held, _ = corpus(None)
    docs = torch.tensor(chunks(held, a.docs, a.seed), dtype=torch.long)
    rows = []
    for n, d, ls in a.target:
        if n in own:  # the target's own text: anchors in its completions
            own_rows = own_docs(own[n], a.docs, a.seed)
            rows.append(probe_target(n, d, ls, own_rows, a.hidden, OWN_PROMPT, probes, a.back))
            rows[-1]["text"] = own[n]
        else:
            rows.append(probe_target(n, d, ls, docs, a.hidden, probes=probes, back=a.back))
    print_table(rows)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(
                {"docs": a.docs, "seed": a.seed, "hidden": a.hidden, "probes": probes, "rows": rows},
                f,
                indent=1,
            )
    return 0


def print_table(rows: list[dict]) -> None:
    for r in rows:
        for layer, c in r.get("context", {}).items():
            cells = "  ".join(f"token {k}: {v:.3f}" for k, v in c.items())
            print(f"{r['target']:10s} layer {layer:3s} from the state at t-1: {cells}")
    if not any(r["slots"] for r in rows):
        return
    print(
        f"{'target':10s} {'layers':7s} {'next':>5s}  "
        + "  ".join(f"slot {s}: anchor/lin/mlp/mlp soft, entropy" for s in SLOTS)
    )
    for r in rows:
        cells = "  ".join(
            "{anchor_only:.3f}/{linear:.3f}/{mlp:.3f}/{mlp_soft:.3f}, {e:.2f}     ".format(
                **r["slots"][s], e=r["slots"][s]["target"]["entropy_nats"]
            )
            for s in SLOTS
        )
        layers = ",".join(map(str, r["layers"]))
        print(f"{r['target']:10s} {layers:7s} {r['next_token_accuracy']:.3f}  {cells}")


if __name__ == "__main__":
    raise SystemExit(main())
