"""Each peer in a venv of its own under ``bench/out/peers/venvs/NAME`` (ignored by git), made once and reused.

- ``specforge``: ``specforge==0.2.0`` pins a CUDA torch 2.11 and sglang (which this bench never runs: the
  features are written offline): installed with ``--no-deps`` over the project's torch (2.13.0 CPU, from this
  machine's disk) and the rest of its requirements, sglang, wandb, tensorboard and yunchang left out;
- ``speculators``: ``speculators==0.9.0`` over torch 2.13.0 CPU; PyPI's CUDA builds of torchvision/torchaudio
  (its requirements) removed, or ``import speculators`` fails on a CPU torch;
- ``dflash``: z-lab's ``dflash[local]==0.1.0``, the neutral evaluator (``dflash_generate``).

On a machine without a package index (the device machine), ``--wheels DIR`` installs from wheels only
(``pip download`` them here into DIR: bench/README.md says how) with ``--no-index --find-links DIR``, into venvs
that see the image's own CUDA torch (``--system-site-packages``; no torch wheel is carried).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENVS = os.path.join(ROOT, "bench", "out", "peers", "venvs")
TORCH = "torch==2.13.0"
SPECFORGE_DEPS = ["transformers==5.8.1", "datasets", "tqdm", "accelerate", "huggingface-hub", "numpy",
                  "openai-harmony", "pydantic", "psutil", "pyyaml", "safetensors", "requests",
                  "typing-extensions"]  # fmt: skip
STEPS = {
    "specforge": [[TORCH], ["--no-deps", "specforge==0.2.0"], [TORCH, *SPECFORGE_DEPS]],
    "speculators": [
        [TORCH],
        [TORCH, "speculators==0.9.0"],
        ["uninstall", "torchvision", "torchaudio", "torchcodec"],
    ],
    "dflash": [[TORCH], [TORCH, "dflash[local]==0.1.0"]],
}
IMPORTS = {"specforge": "specforge.cli", "speculators": "speculators.train.cli", "dflash": "dflash.model"}


def python(name: str) -> str:
    return os.path.join(VENVS, name, "bin", "python")


def stamp(name: str) -> str:
    return os.path.join(VENVS, name, ".installed")


def install(name: str, wheels: str | None = None, log=sys.stderr) -> dict:
    """The peer's venv (made unless its stamp is there); its packages' versions."""
    if not os.path.isfile(stamp(name)):
        # a device machine: the image's CUDA torch, seen through --system-site-packages, and the wheels carried
        venv = ["--system-site-packages"] if wheels else []
        subprocess.run([sys.executable, "-m", "venv", *venv, os.path.join(VENVS, name)], check=True)
        src = ["--no-index", "--find-links", wheels] if wheels else []
        for step in STEPS[name]:
            step = [x for x in step if not (wheels and x == TORCH)]
            if not step:
                continue
            if step[0] == "uninstall":
                argv = [python(name), "-m", "pip", "uninstall", "-q", "-y", *step[1:]]
            else:
                argv = [python(name), "-m", "pip", "install", "-q", *src, *step]
            subprocess.run(argv, check=True, stdout=log, stderr=log)
        subprocess.run([python(name), "-c", f"import {IMPORTS[name]}"], check=True)
        open(stamp(name), "w").close()
    return versions(name)


def versions(name: str) -> dict:
    code = (
        "import importlib.metadata as m, json; "
        f"print(json.dumps({{p: m.version(p) for p in ('torch', 'transformers', {name!r})}}))"
    )
    out = subprocess.run([python(name), "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])
