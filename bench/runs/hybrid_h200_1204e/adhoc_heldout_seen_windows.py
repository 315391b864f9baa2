import sys, numpy as np
from collections import Counter
from trainer.data.dataset import load_dir, held_out
ds = load_dir(sys.argv[1], 512)
held = set(held_out(len(ds), 256, 1).tolist())
docs = [ds.tokens[int(ds.offsets[s]):int(ds.offsets[s+1])].tobytes() for s in range(len(ds))]
comp = [ds.tokens[int(ds.offsets[s])+128:int(ds.offsets[s+1])].tobytes() for s in range(len(ds))]
train_docs = Counter(d for i, d in enumerate(docs) if i not in held)
train_comp = Counter(c for i, c in enumerate(comp) if i not in held)
hd = [i for i in held if docs[i] in train_docs]; hc = [i for i in held if comp[i] in train_comp]
print("held-out docs with an identical training doc:", len(hd), "identical completion:", len(hc), "of", len(held))
# 32-token windows of completions: share of held-out completion windows found in training completions
def grams(b, n=32*8): return {b[i:i+n] for i in range(0, len(b)-n+1, 8)}
W = set()
for i, c in enumerate(comp):
    if i not in held: W |= grams(c)
share = [np.mean([g in W for g in grams(comp[i])]) for i in held]
print("held-out completions: share of 32-token windows seen in training completions:", float(np.mean(share)))
