"""The acceptance walk's reference: decoding over sampled anchors, one verify step at a time."""


def decode_steps(anchors: list[int], chains: list[int]) -> tuple[int, int]:
    """(tokens, verify steps): accept chain + 1 tokens at an anchor, go on at the first anchor at or after the
    bonus token's position."""
    by_pos = dict(zip(anchors, chains, strict=True))
    tokens = steps = 0
    p = anchors[0] if anchors else None
    while p is not None:
        c = by_pos[p]
        tokens, steps = tokens + c + 1, steps + 1
        p = next((a for a in anchors if a >= p + c + 1), None)
    return tokens, steps
