import sys, torch, numpy as np
sys.path.insert(0, "bench")
import est_seen as E
from trainer.data.dataset import load_dir, held_out
from trainer.target.capture import load_target
from trainer.model import load_drafter
from trainer.drafting.head import FrozenHead
torch.set_num_threads(2)
ds = load_dir(sys.argv[1], 512)
held = held_out(len(ds), 256, 1)
rest = np.setdiff1d(np.arange(len(ds)), held)
other = np.random.default_rng(0).choice(rest, 512, replace=False)
def rows(idx):
    out = []
    for s in idx:
        a, b = int(ds.offsets[s]), int(ds.offsets[s + 1])
        ids, lm = ds.tokens[a:b].tolist(), ds.mask[a:b].astype(int).tolist()
        if len(ids) == E.SEQ: out.append((ids, lm))
    return out
dr, cfg = load_drafter(sys.argv[2]); dr = dr.float().eval()
model = load_target(sys.argv[3], "cpu", torch.float32, list(cfg.target_layer_ids), need_final_hidden=True)
head = FrozenHead.from_model(model)
h, o = rows(held), rows(other)
print("len(ds)", len(ds), "held rows", len(h), "other rows", len(o))
print("held-out set", E.estimate(model, dr, head, h), "others", E.estimate(model, dr, head, o))
