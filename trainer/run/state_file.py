"""A checkpoint's ``state.pt`` (optimizer moments, RNG states, step, cursor...): written with ``torch.save``,
read back by torch's restricted unpickler only (``weights_only=True``), never by ``pickle`` itself.

What the trainer writes holds tensors, dicts, lists, tuples, strings, numbers, booleans and None, which
that unpickler builds without running any code of the file's choosing: the RNG states are stored as such
(numpy's MT19937 key as an int64 tensor, ``pack_numpy_rng``), not as numpy arrays. A ``state.pt`` of an
older trainer (trainer 0.1.0 stored numpy's state as ``np.random.get_state()``: a uint32 array) loads too:
the three numpy globals such an array needs (``numpy.ndarray``, ``numpy.dtype``, numpy's ``_reconstruct``)
are allowed while it is read, and nothing else. Anything else (a global such as ``os.system`` in a crafted
file) is refused with ``StateFileError`` naming the file and what it asked for.
"""

from __future__ import annotations

import os

STATE_FILE = "state.pt"
REQUIRED = ("step", "cursor", "optimizer", "rng")  # what a resume reads (runtime/build.py)


class StateFileError(ValueError):
    """A ``state.pt`` that the safe loader refuses or that lacks what a resume needs; names the file."""


def pack_numpy_rng() -> dict:
    """numpy's global RNG state in plain types: ``{"bit_generator", "key" (int64 tensor), "pos", ...}``."""
    import numpy as np
    import torch

    s = np.random.get_state(legacy=False)
    return {
        "bit_generator": s["bit_generator"],
        "key": torch.from_numpy(np.asarray(s["state"]["key"], dtype=np.int64)),
        "pos": int(s["state"]["pos"]),
        "has_gauss": int(s["has_gauss"]),
        "gauss": float(s["gauss"]),
    }


def unpack_numpy_rng(saved) -> None:
    """Restore numpy's global RNG from ``pack_numpy_rng``'s dict, or from an older ``get_state()`` tuple."""
    import numpy as np

    if isinstance(saved, tuple):  # an older trainer's state.pt
        np.random.set_state(saved)
        return
    key = np.asarray(saved["key"].numpy(), dtype=np.uint32)
    np.random.set_state(
        {
            "bit_generator": saved["bit_generator"],
            "state": {"key": key, "pos": int(saved["pos"])},
            "has_gauss": int(saved["has_gauss"]),
            "gauss": float(saved["gauss"]),
        }
    )


def _old_numpy_globals() -> list:
    """The globals an older trainer's numpy RNG state needs (a uint32 array), and no other."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _why(e: Exception) -> str:
    """The line of torch's refusal that says what the file asked for (``... GLOBAL posix.system ...``)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    hit = next((ln for ln in lines if "GLOBAL" in ln), lines[-1] if lines else type(e).__name__)
    return hit.split("WeightsUnpickler error:", 1)[-1].strip()[:300]


def load_state(ckpt_dir: str, map_location: str = "cpu") -> dict:
    """``ckpt_dir/state.pt`` through the restricted unpickler (memory-mapped: the optimizer's moments go to
    their device once, in ``load_state_dict``); ``StateFileError`` naming the file when it is refused."""
    import pickle

    import torch

    path = os.path.join(ckpt_dir, STATE_FILE)
    try:
        with torch.serialization.safe_globals(_old_numpy_globals()):
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        raise StateFileError(
            f"{path}: refused by the safe loader (it holds something a trainer never writes: {_why(e)}); "
            "it was not loaded. Resume from another checkpoint (--resume PATH) or start fresh (--resume none)"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        raise StateFileError(f"{path}: unreadable ({type(e).__name__}: {str(e)[:300]})") from None
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED):
        raise StateFileError(f"{path}: not a trainer's state (expected a dict with {', '.join(REQUIRED)})")
    return state
