"""Anchor sampling and mask construction (trainer/drafting/masks.py)."""

import pytest
import torch

from trainer.drafting.masks import (
    anchor_count,
    dense_mask,
    doc_positions,
    flex_block_mask,
    sample_anchors,
    sample_run,
)


def _valid_positions(doc, lm, bs):
    """Brute force: anchors whose block lies in one real document with slots 1.. in the loss mask."""
    T = len(doc)
    out = []
    for a in range(T - bs + 1):
        if doc[a] < 0:
            continue
        if any(doc[p] != doc[a] for p in range(a, a + bs)):
            continue
        if not all(lm[p] for p in range(a + 1, a + bs)):
            continue
        out.append(a)
    return out


def _random_row(g, T):
    doc = torch.zeros(T, dtype=torch.long)
    cuts = sorted(torch.randint(1, T, (3,), generator=g).tolist())
    for i, c in enumerate(cuts):
        doc[c:] = i + 1
    doc[T - 3 :] = -1  # padding tail
    lm = torch.rand(T, generator=g) > 0.2
    return doc, lm


def test_sample_anchors_only_valid_and_all_when_room():
    g = torch.Generator().manual_seed(0)
    bs = 4
    docs, lms = zip(*[_random_row(g, 40) for _ in range(3)], strict=True)
    doc, lm = torch.stack(docs), torch.stack(lms)
    anchors = sample_anchors(doc, lm, bs, max_anchors=1000, generator=torch.Generator().manual_seed(1))
    for r in range(3):
        want = _valid_positions(doc[r].tolist(), lm[r].tolist(), bs)
        got = [a for a in anchors[r].tolist() if a >= 0]
        assert got == want  # every valid anchor, sorted, nothing else
        assert all(a == -1 for a in anchors[r, len(got) :].tolist())  # padding at the end


def test_sample_anchors_capped_random_without_replacement():
    T, bs = 64, 3
    doc = torch.zeros(2, T, dtype=torch.long)
    doc[:, 30:] = 1
    lm = torch.ones(2, T, dtype=torch.bool)
    lm[1] = False  # row 1 has no valid anchor at all
    a1 = sample_anchors(doc, lm, bs, 5, torch.Generator().manual_seed(1))
    a2 = sample_anchors(doc, lm, bs, 5, torch.Generator().manual_seed(2))
    a1b = sample_anchors(doc, lm, bs, 5, torch.Generator().manual_seed(1))
    assert a1.shape == (2, 5)
    assert torch.equal(a1, a1b)
    assert not torch.equal(a1, a2)
    row = a1[0].tolist()
    assert row == sorted(row) and len(set(row)) == 5
    valid = set(_valid_positions(doc[0].tolist(), lm[0].tolist(), bs))
    assert set(row) <= valid
    assert a1[1].tolist() == [-1] * 5


def test_sample_anchors_none_valid_gives_one_padding_column():
    doc = torch.zeros(2, 5, dtype=torch.long)
    lm = torch.zeros(2, 5, dtype=torch.bool)
    a = sample_anchors(doc, lm, 4, 8)
    assert a.tolist() == [[-1], [-1]]


def test_sample_anchors_rejects_bad_block_size():
    with pytest.raises(ValueError, match="block_size"):
        sample_anchors(torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8, dtype=torch.bool), 1, 4)


def test_doc_positions_restart_per_document():
    doc = torch.tensor([[0, 0, 0, 5, 5, 2, -1, -1]])
    assert doc_positions(doc).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]


def test_dense_mask_small_case_and_padding_block():
    # T = 8 context positions, doc boundary at 4; blocks of 3 at anchors 2, 6 and one padding block
    doc = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    anchors = torch.tensor([[2, 6, -1]])
    m = dense_mask(anchors, doc, 3)[0, 0]
    T = 8
    assert m.shape == (9, T + 9)
    # block 0: context 0, 1 only (strictly before anchor 2), its own 3 slots
    for q in range(3):
        assert m[q, :T].nonzero().flatten().tolist() == [0, 1]
        assert m[q, T:].nonzero().flatten().tolist() == [0, 1, 2]
    # block 1 (doc 1, anchor 6): context 4, 5 only; never doc 0
    for q in range(3, 6):
        assert m[q, :T].nonzero().flatten().tolist() == [4, 5]
        assert m[q, T:].nonzero().flatten().tolist() == [3, 4, 5]
    # padding block: only itself
    for q in range(6, 9):
        assert m[q, :T].sum() == 0
        assert m[q, T:].nonzero().flatten().tolist() == [6, 7, 8]
    # sliding window 2: slot k of anchor a sees p with (a + k) - p < 2 -> only p = a - 1 for slot 0
    ms = dense_mask(anchors, doc, 3, sliding_window=2)[0, 0]
    assert ms[0, :T].nonzero().flatten().tolist() == [1]
    assert ms[1, :T].sum() == 0 and ms[2, :T].sum() == 0
    assert ms[0, T:].nonzero().flatten().tolist() == [0, 1, 2]  # own block stays fully visible


def test_flex_block_mask_matches_dense_mask():
    from torch.nn.attention.flex_attention import create_mask

    from trainer.drafting.masks import mask_mod

    g = torch.Generator().manual_seed(3)
    docs, lms = zip(*[_random_row(g, 50) for _ in range(2)], strict=True)
    doc, lm = torch.stack(docs), torch.stack(lms)
    anchors = sample_anchors(doc, lm, 4, 6, torch.Generator().manual_seed(4))
    T, Q = 50, anchors.shape[1] * 4
    for w in (None, 5):
        dense = dense_mask(anchors, doc, 4, w)
        flex = create_mask(mask_mod(anchors, doc, 4, w), 2, None, Q, T + Q, device="cpu")
        assert torch.equal(dense, flex)
        bm = flex_block_mask(anchors, doc, 4, w)
        assert bm.shape[-2:] == (Q, T + Q)


@pytest.mark.parametrize("window", [None, 37])
def test_flex_block_mask_tiles_equal_create_block_mask(window):
    """The BlockMask built from the anchors has exactly the tiles (partial and full) that evaluating the
    predicate over every pair gives (torch's create_block_mask), for random packed rows."""
    from torch.nn.attention.flex_attention import create_block_mask

    from trainer.drafting.masks import mask_mod

    g = torch.Generator().manual_seed(7)
    for _ in range(6):
        T = int(torch.randint(200, 600, (1,), generator=g))
        bs = int(torch.randint(2, 20, (1,), generator=g))
        doc, lm = _random_row(g, T)
        doc, lm = torch.stack([doc, doc.roll(50)]), torch.stack([lm, lm])
        anchors = sample_anchors(doc, lm, bs, 40, g, pad_to_max=True)
        Q = anchors.shape[1] * bs
        ref = create_block_mask(
            mask_mod(anchors, doc, bs, window), B=2, H=None, Q_LEN=Q, KV_LEN=T + Q, device="cpu"
        )
        got = flex_block_mask(anchors, doc, bs, window)
        assert torch.equal(got.to_dense(), ref.to_dense())
        for b in range(2):
            for qb in range(ref.kv_num_blocks.shape[-1]):
                n_ref, n_got = int(ref.full_kv_num_blocks[b, 0, qb]), int(got.full_kv_num_blocks[b, 0, qb])
                assert set(got.full_kv_indices[b, 0, qb, :n_got].tolist()) <= set(
                    ref.full_kv_indices[b, 0, qb, :n_ref].tolist()
                )


def test_sample_anchors_pad_to_max_has_a_fixed_width():
    doc = torch.zeros(2, 40, dtype=torch.long)
    lm = torch.ones(2, 40, dtype=torch.bool)
    lm[1, 10:] = False  # row 1: few candidates
    a = sample_anchors(doc, lm, 4, 12, torch.Generator().manual_seed(0), pad_to_max=True)
    assert a.shape == (2, 12)
    assert (a[0] >= 0).all() and (a[1] >= 0).sum() == 7 and (a[1, 7:] == -1).all()
    assert sample_anchors(doc, lm, 4, 100, pad_to_max=True).shape == (2, 37)  # capped by T - bs + 1


@pytest.mark.parametrize("max_anchors", [3, 1000])
def test_anchor_count_gives_the_anchors_the_device_sync_would(max_anchors):
    """The drafter reads A from host copies of the rows (no device sync); it must be the A that
    sample_anchors reads on its own: the same anchors, bit for bit, for the same generator."""
    g = torch.Generator().manual_seed(3)
    for trial in range(6):
        docs, lms = zip(*[_random_row(g, 48) for _ in range(3)], strict=True)
        doc, lm = torch.stack(docs), torch.stack(lms)
        if trial == 0:
            lm[:] = False  # no candidate anywhere: one padding column
        count = anchor_count(doc, lm, 4, max_anchors)
        want = max(
            1,
            min(
                max_anchors,
                max(len(_valid_positions(d.tolist(), m.tolist(), 4)) for d, m in zip(doc, lm, strict=True)),
            ),
        )
        assert count == want
        ref = sample_anchors(doc, lm, 4, max_anchors, torch.Generator().manual_seed(trial))
        got = sample_anchors(doc, lm, 4, max_anchors, torch.Generator().manual_seed(trial), num_anchors=count)
        assert torch.equal(ref, got)
    assert anchor_count(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool), 4, 8) == 1


def test_sample_anchors_in_runs_take_whole_groups_of_consecutive_candidates():
    B, T, bs, R = 2, 300, 8, 16
    doc = torch.zeros(B, T, dtype=torch.long)
    doc[:, 140:] = 1  # a document boundary: candidates stop short of it
    lm = torch.ones(B, T, dtype=torch.long)
    lm[:, :30] = 0  # a prompt: no anchor whose predicted positions fall in it
    g = torch.Generator().manual_seed(1)
    a = sample_anchors(doc, lm, bs, 100, g, run_length=R)
    ref = sample_anchors(doc, lm, bs, 10_000, torch.Generator().manual_seed(0))  # every candidate
    for b in range(B):
        cand = ref[b][ref[b] >= 0].tolist()
        got = a[b][a[b] >= 0].tolist()
        assert len(got) == 100 and got == sorted(set(got)) and set(got) <= set(cand)
        groups = {}
        for x in got:  # the group of a candidate: its rank among the row's candidates // R
            groups.setdefault(cand.index(x) // R, []).append(cand.index(x))
        whole = [k for k, v in groups.items() if len(v) == min(R, len(cand) - k * R)]
        assert len(groups) - len(whole) <= 1  # whole groups, but for the last one drawn (cut at 100)
        for v in groups.values():
            assert v == list(range(v[0], v[0] + len(v)))  # consecutive candidates


@pytest.mark.parametrize("R", [1, 8])
def test_sample_anchors_draw_every_candidate_alike_scattered_or_in_runs(R):
    T, bs, A, n = 200, 8, 48, 3000
    doc = torch.zeros(1, T, dtype=torch.long)
    lm = torch.ones(1, T, dtype=torch.long)
    g = torch.Generator().manual_seed(2)
    hits = torch.zeros(T - bs + 1)
    for _ in range(n):
        hits[sample_anchors(doc, lm, bs, A, g, run_length=R)[0]] += 1
    p = A / (T - bs + 1)
    # each candidate's count is binomial-like (runs add correlation, not bias): within 6 sd of n * p
    assert (hits / n - p).abs().max() < 6 * (p * (1 - p) * R / n) ** 0.5


def test_sample_run_is_one_stretch_of_consecutive_candidates_per_row():
    """``sample_run`` (the trainer's measuring blocks): per row, ``length`` consecutive candidates in rank order,
    every start that leaves room reachable and no other; a row with fewer candidates gives all of them, padded."""
    g = torch.Generator().manual_seed(4)
    rows = [_random_row(g, 120) for _ in range(3)]
    doc = torch.stack([r[0] for r in rows] + [torch.full((120,), -1)])
    lm = torch.stack([r[1] for r in rows] + [torch.ones(120, dtype=torch.bool)])
    lm[2, 16:] = False  # a row with few candidates
    bs, L = 4, 10
    cands = [_valid_positions(doc[b].tolist(), lm[b].tolist(), bs) for b in range(4)]
    assert len(cands[0]) > L and len(cands[1]) > L and 0 < len(cands[2]) < L and cands[3] == []
    A = anchor_count(doc, lm, bs, L)
    starts = [set() for _ in range(4)]
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        a = sample_run(doc, lm, bs, L, gen, num_anchors=A)
        assert a.shape == (4, A) == (4, L)
        for b in range(4):
            got = a[b][a[b] >= 0].tolist()
            assert (a[b][len(got) :] == -1).all()
            if len(cands[b]) <= L:
                assert got == cands[b]
                continue
            i = cands[b].index(got[0])
            assert got == cands[b][i : i + L]
            starts[b].add(i)
    for b in (0, 1):
        assert starts[b] == set(range(len(cands[b]) - L + 1))
    assert sample_run(doc, lm, bs, L, torch.Generator().manual_seed(0)).shape == (
        4,
        L,
    )  # A read on the device
