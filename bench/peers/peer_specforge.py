"""SpecForge (``specforge==0.2.0``, DFlash) on the bench's offline features: its typed config, ``specforge
train`` in its venv, then ``specforge export --to hf`` (z-lab's layout, which both evaluators read).

Matched to ours: 2 draft layers, block 8, the same target layers (its draft config's
``dflash_config.target_layer_ids``, z-lab numbering), mask token, data-token labels (its DFlash loss is cross-entropy on the data token), loss decay
gamma 7 over block positions (``loss_decay_gamma``), the same anchors a step (``num_anchors`` per sample x
``batch_size`` samples = ours per packed row), AdamW at the same learning rate, warm-up ratio, cosine schedule
and grad clip. CPU: fp32, ``attention_backend=sdpa``, ``fsdp_sharding=NO_SHARD`` (one process, gloo); GPU:
bf16, ``flex_attention``."""

from __future__ import annotations

import glob
import json
import os

from bench.peers import install, launch


def config(work: str, s: dict) -> dict:
    gpu = s["device"] != "cpu"
    return {
        "run_id": "specforge-run",
        "output_dir": os.path.join(work, "run_specforge"),
        "model": {
            "target_model_path": os.path.join(work, "target"),
            "draft_model_config": os.path.join(work, "specforge_draft.json"),
            "mask_token_id": s["mask"],
            "torch_dtype": "bfloat16" if gpu else "float32",
            "embedding_key": "model.embed_tokens.weight",
            "lm_head_key": "lm_head.weight",
        },  # fmt: skip
        "data": {
            "hidden_states_path": os.path.join(work, "features_specforge"),
            "max_length": s["seq"],
            "dataloader_num_workers": 0,
        },  # fmt: skip
        "training": {
            "strategy": "dflash",
            "num_epochs": s["epochs"],
            "max_steps": s["steps"],
            "batch_size": s["seqs_per_step"],
            "fsdp_sharding": "NO_SHARD",
            "learning_rate": s["lr"],
            "lr_scheduler": "cosine",
            "warmup_ratio": s["warmup"],
            "max_grad_norm": 1.0,
            "attention_backend": "flex_attention" if gpu else "sdpa",
            "num_anchors": s["anchors"] // s["seqs_per_step"],
            "loss_decay_gamma": s["gamma"],
            "save_interval": s["steps"],
            "log_interval": s["log_every"],
            "seed": s["seed"],
        },  # fmt: skip
        "tracking": {"report_to": "none"},
    }


def draft_config(work: str, s: dict) -> dict:
    """Its draft config (z-lab's layout, which SpecForge reads: the target layers come from it): the target's
    Qwen3 config with the drafter's layers, block, target layers and mask token."""
    with open(os.path.join(work, "target", "config.json")) as f:
        cfg = json.load(f)
    cfg.update({"architectures": ["DFlashDraftModel"], "num_hidden_layers": s["layers"], "block_size": s["block"],
                "num_target_layers": cfg["num_hidden_layers"],
                "dflash_config": {"target_layer_ids": s["layer_ids"], "mask_token_id": s["mask"]}})  # fmt: skip
    cfg.pop("layer_types", None)
    return cfg


def env(s: dict) -> dict:
    e = dict(os.environ)
    e.pop("PYTHONPATH", None)
    if s["device"] == "cpu":
        e["CUDA_VISIBLE_DEVICES"] = ""
    e["OMP_NUM_THREADS"] = str(s["threads"])
    return e


def train(work: str, out: str, s: dict) -> dict:
    with open(os.path.join(work, "specforge_draft.json"), "w") as f:
        json.dump(draft_config(work, s), f, indent=1)
    cfg = config(work, s)
    path = os.path.join(work, "specforge.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    argv = [install.python("specforge"), os.path.join(os.path.dirname(__file__), "specforge_launch.py"),
            "train", "-c", path]  # fmt: skip
    return launch.run(argv, os.path.join(out, "train_specforge.log"), env=env(s), cwd=work)


def export(work: str, out: str, s: dict) -> tuple[dict, str]:
    """``specforge export --to hf`` of the run's last checkpoint into ``work/export_specforge``."""
    run_dir = os.path.join(work, "run_specforge")
    steps = sorted(
        glob.glob(os.path.join(run_dir, "specforge-run-step*")), key=lambda p: int(p.rsplit("step", 1)[1])
    )
    if not steps:
        raise SystemExit(f"specforge: no checkpoint under {run_dir}")
    dest = os.path.join(work, "export_specforge")
    draft_cfg = os.path.join(work, "specforge_draft.json")
    argv = [install.python("specforge"), os.path.join(os.path.dirname(__file__), "specforge_launch.py"),
            "export", "--to", "hf", "--checkpoint", steps[-1], "--draft-config", draft_cfg, "--output-dir", dest]  # fmt: skip
    r = launch.run(argv, os.path.join(out, "export_specforge.log"), env=env(s), cwd=work)
    return r, dest
