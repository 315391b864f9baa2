"""A vLLM general plugin: ``import torchvision``'s four modules that Qwen3.5's model file needs, as empty
stubs, for a venv without torchvision.

vLLM's ``qwen3_5.py`` imports ``qwen3_vl.py``, which imports transformers' ``image_processing_qwen2_vl``, whose
first lines are ``from torchvision.transforms.v2 import functional as tvF`` (transformers 5.19; the module
uses it only to process images). PyPI has no CPU build of torchvision for torch 2.13 (its 0.28.0 links CUDA's
libraries and fails beside CPU torch: ``operator torchvision::nms does not exist``), so the serve venv has no
torchvision and a Qwen3.5 / Qwen3.6 target fails to load. Text prompts never reach the image code: the stubs
only let the import through.

transformers decides "is torchvision installed" once (``is_torchvision_available``, cached) by looking for
the module: the answer is taken, False, before the stubs go in, so transformers keeps to its PIL image
processor and never calls into them. A venv with a real torchvision is left as it is. Loaded in every vLLM
process (the engine, its workers, the model registry's inspection subprocess) before any model file;
``VLLM_PLUGINS=...,cpu_no_torchvision`` selects it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

MODULES = (
    "torchvision",
    "torchvision.transforms",
    "torchvision.transforms.v2",
    "torchvision.transforms.v2.functional",
)


def register() -> None:
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # False, cached, before the stubs exist
    mods = {}
    for name in MODULES:
        mods[name] = types.ModuleType(name, "empty stub (tests/serving/vllm_plugin: no_torchvision)")
        mods[name].__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=name != MODULES[-1])
        sys.modules[name] = mods[name]
    for name in MODULES[1:]:
        parent, _, leaf = name.rpartition(".")
        setattr(mods[parent], leaf, mods[name])
