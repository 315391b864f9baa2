"""DraftConfig: the DFlash drafter's shape, derived from the target model's config.

API (stable; the pipeline codes against it):
- ``DraftConfig`` dataclass (fields below), validated on construction (``ConfigError``, a ``ValueError``, with
  the ``setting`` it is about).
- ``DraftConfig.from_target_config(target_config, *, num_draft_layers=1, block_size=16,
  mask_token_id=None, target_layer_ids=None, layer_types=None, sliding_window=None, arch="dflash",
  dflash2=None)``:
  sizes from the target (a multimodal config's ``text_config``). Only Qwen3 / Llama-style decoders
  (``SUPPORTED_MODEL_TYPES``) are accepted. ``mask_token_id`` defaults to the last vocab id (an
  embedding row no text uses in Qwen3 / Llama-3 vocabularies; pass the tokenizer's mask token, or its first
  unused id as the published Qwen3 drafters do, when there is one; never a token that occurs in data). ``layer_types`` defaults to all ``full_attention``; sliding layers take
  ``sliding_window`` or else the target's.
- ``default_target_layer_ids(num_target_layers, n)``: the reference rule (z-lab/dflash): one layer ->
  ``[L // 2]``; else ``round(1 + i * (L - 4) / (n - 1))``. Layer ``i`` means the hidden state AFTER
  target layer ``i`` (``hidden_states[i + 1]`` in transformers' numbering).
- ``arch``: ``"dflash"`` (DFlash 1, the default) or ``"dflash2"``, whose four fields ``conv_kernel_size``,
  ``conv_group_size``, ``selector_rank``, ``selector_top_k`` (``DFLASH2_DEFAULTS``: 2, 16, 256, 16) are None on
  DFlash 1; ``dflash2_fields(arch, given)`` fills them.
- ``to_dict()`` / ``from_dict()``: plain JSON-able dict round trip.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

LAYER_TYPES = ("full_attention", "sliding_attention")
ARCHS = ("dflash", "dflash2")
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# the published DFlash 2 defaults (z-lab drafters; vllm-project/speculators DFlash2SpeculatorConfig)
DFLASH2_DEFAULTS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
# a drafter is a few layers; no target has this many (the largest decoders have ~128): checked before any list
# of layers is made, so a config of 10**12 layers is a ConfigError, not a MemoryError
MAX_DRAFT_LAYERS = 1024


def machine_bytes() -> int:
    """This machine's physical memory (the bound on a drafter's fp32 weights); 2**40 where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 2**40


class ConfigError(ValueError):
    """A DraftConfig that cannot be; ``setting`` is the field (or target config entry) the failed rule is
    about, so that the trainer names its flag (``trainer.run.flags.flag_for_setting``)."""

    def __init__(self, setting: str, message: str):
        super().__init__(message)
        self.setting = setting


# model_type of the (text) config -> accepted. All are pre-norm RMSNorm decoders with RoPE and GQA whose
# hidden states the drafter can read; the drafter itself is always Qwen3-style.
SUPPORTED_MODEL_TYPES = frozenset(
    {
        "qwen3",
        "qwen3_moe",
        "qwen2",
        "qwen2_moe",
        "llama",
        "mistral",
        "qwen3_5",
        "qwen3_5_text",
        "qwen3_5_moe",
        "qwen3_5_moe_text",
        "qwen3_next",
    }
)

# RoPE variants the drafter can reproduce (through transformers' rope init functions).
_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


def default_target_layer_ids(num_target_layers: int, n: int) -> list[int]:
    """Reference rule for which target layers feed the drafter (after-layer indices, 0-based). Where it would
    name a layer twice (a short target: 4 layers, 2 drafter layers gives [1, 1]), the layers are spread over
    the whole stack instead: vLLM and SGLang capture each layer once, in order, so a repeated id serves the
    drafter fewer features than it trained on (docs/model.md, "What each server reads")."""
    if n < 1:
        raise ValueError(f"number of target layers to capture must be >= 1, got {n}")
    if n > MAX_DRAFT_LAYERS:  # before a list of n ids is made
        raise ConfigError(
            "num_draft_layers", f"num_draft_layers must be an integer in 1..{MAX_DRAFT_LAYERS}, got {n}"
        )
    if n == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    ids = [int(round(start + i * (end - start) / (n - 1))) for i in range(n)]
    if len(set(ids)) < n or end < start:
        ids = [int(round(i * (num_target_layers - 1) / (n - 1))) for i in range(n)]
    if len(set(ids)) < n:
        raise ValueError(f"{n} distinct target layers asked for, the target has {num_target_layers}")
    return ids


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    num_draft_layers: int = 1
    block_size: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # transformers rope_parameters minus rope_theta; None = plain RoPE
    max_position_embeddings: int = 32768
    layer_types: list[str] = field(default_factory=list)  # empty -> all full_attention
    sliding_window: int | None = None
    attention_bias: bool = False
    # the drafter architecture: "dflash" (DFlash 1) or "dflash2" (the four fields below; None on "dflash")
    arch: str = "dflash"
    conv_kernel_size: int | None = None  # taps of the grouped dynamic causal convolution
    conv_group_size: int | None = None  # channels sharing one dynamic coefficient
    selector_rank: int | None = None  # rank of the candidate selector's bilinear term
    selector_top_k: int | None = None  # candidates kept per block position

    def __post_init__(self) -> None:
        self._validate_size()  # before anything is sized by the fields
        if not self.layer_types:
            self.layer_types = ["full_attention"] * self.num_draft_layers
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        self.layer_types = list(self.layer_types)
        self.validate()

    # -- validation ---------------------------------------------------------------------------------
    def validate(self) -> None:
        def positive(name: str) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(name, f"{name} must be a positive integer, got {v!r}")

        for name in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "num_target_layers",
            "num_draft_layers",
            "max_position_embeddings",
        ):
            positive(name)
        if not isinstance(self.block_size, int) or self.block_size < 2:
            raise ConfigError(
                "block_size",
                f"block_size must be an integer >= 2 (anchor + >=1 mask slot), got {self.block_size!r}",
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                "num_attention_heads",
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})",
            )
        if not self.target_layer_ids:
            raise ConfigError("target_layer_ids", "target_layer_ids must name at least one target layer")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if bad:
            raise ConfigError(
                "target_layer_ids",
                f"target_layer_ids {bad} out of range: the target has num_target_layers="
                f"{self.num_target_layers} (valid 0..{self.num_target_layers - 1})",
            )
        if not isinstance(self.mask_token_id, int) or not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(
                "mask_token_id",
                f"mask_token_id={self.mask_token_id!r} is outside the vocabulary (vocab_size={self.vocab_size})",
            )
        if len(self.layer_types) != self.num_draft_layers:
            raise ConfigError(
                "layer_types",
                f"layer_types has {len(self.layer_types)} entries, expected num_draft_layers={self.num_draft_layers}",
            )
        for t in self.layer_types:
            if t not in LAYER_TYPES:
                raise ConfigError("layer_types", f"layer_types entry {t!r} is not one of {LAYER_TYPES}")
        if self.sliding_window is not None and (
            not isinstance(self.sliding_window, int) or self.sliding_window < 1
        ):
            raise ConfigError(
                "sliding_window",
                f"sliding_window must be a positive integer or None, got {self.sliding_window!r}",
            )
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ConfigError(
                "layer_types", "layer_types has sliding_attention layers but sliding_window is None"
            )
        self._validate_arch()
        if self.rope_scaling is not None:
            rtype = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if rtype not in _ROPE_TYPES:
                raise ConfigError(
                    "rope_scaling",
                    f"rope_scaling rope_type {rtype!r} is not supported (one of {_ROPE_TYPES})",
                )

    def parameters(self) -> int:
        """The drafter's parameter count from its sizes (fc, the layers, a DFlash 2 selector's codebooks)."""
        h, hd = self.hidden_size, self.head_dim
        attn = 2 * h * self.num_attention_heads * hd + 2 * h * self.num_key_value_heads * hd
        layer = attn + 3 * h * self.intermediate_size
        n = h * len(self.target_layer_ids) * h + self.num_draft_layers * layer
        if self.arch == "dflash2" and isinstance(self.selector_rank, int):
            n += 2 * self.vocab_size * self.selector_rank
        return n

    def _validate_size(self) -> None:
        """Sizes bounded before they are used: the layer count, and the fp32 weights within the machine's memory."""
        n = self.num_draft_layers
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_DRAFT_LAYERS:
            raise ConfigError(
                "num_draft_layers", f"num_draft_layers must be an integer in 1..{MAX_DRAFT_LAYERS}, got {n!r}"
            )
        sizes = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
        if not all(type(getattr(self, k)) is int and getattr(self, k) > 0 for k in (*sizes, "vocab_size")):
            return  # validate() names the field
        if not isinstance(self.target_layer_ids, list):
            return
        need, have = 4 * self.parameters(), machine_bytes()
        if need > have:
            raise ConfigError(
                "hidden_size",
                f"these sizes make a drafter of {self.parameters():,} parameters ({need / 1e9:.1f} GB in fp32), "
                f"more than this machine's memory ({have / 1e9:.1f} GB)",
            )

    def _validate_arch(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError("arch", f"arch must be one of {ARCHS}, got {self.arch!r}")
        names = DFLASH2_FIELDS
        if self.arch == "dflash":
            set_ = [n for n in names if getattr(self, n) is not None]
            if set_:
                raise ConfigError(
                    set_[0], f"{', '.join(set_)} only apply to arch 'dflash2' (arch is 'dflash')"
                )
            return
        for n in names:
            v = getattr(self, n)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(n, f"{n} must be a positive integer for arch 'dflash2', got {v!r}")
        if self.conv_kernel_size > self.block_size:
            raise ConfigError(
                "conv_kernel_size",
                f"conv_kernel_size ({self.conv_kernel_size}) cannot exceed block_size ({self.block_size})",
            )
        if self.hidden_size % self.conv_group_size:
            raise ConfigError(
                "conv_group_size",
                f"conv_group_size ({self.conv_group_size}) must divide hidden_size ({self.hidden_size})",
            )
        if self.selector_top_k > self.vocab_size:
            raise ConfigError(
                "selector_top_k",
                f"selector_top_k ({self.selector_top_k}) cannot exceed vocab_size ({self.vocab_size})",
            )

    # -- derived --------------------------------------------------------------------------------------
    @property
    def num_captured(self) -> int:
        return len(self.target_layer_ids)

    def window_of(self, layer_idx: int) -> int | None:
        """The sliding window of draft layer ``layer_idx`` (None on full-attention layers)."""
        return self.sliding_window if self.layer_types[layer_idx] == "sliding_attention" else None

    # -- (de)serialisation ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DraftConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown DraftConfig settings: {sorted(unknown)}")
        return cls(**d)

    # -- from a transformers config ----------------------------------------------------------------------
    @classmethod
    def from_target_config(
        cls,
        target_config: Any,
        *,
        num_draft_layers: int = 1,
        block_size: int = 16,
        mask_token_id: int | None = None,
        target_layer_ids: list[int] | None = None,
        layer_types: list[str] | None = None,
        sliding_window: int | None = None,
        arch: str = "dflash",
        dflash2: dict[str, int | None] | None = None,
    ) -> DraftConfig:
        tc = text_config_of(target_config)
        mt = getattr(tc, "model_type", None)
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                "model_type",
                f"target model_type={mt!r} is not supported: the drafter needs a Qwen3 or Llama-style "
                f"decoder (one of {sorted(SUPPORTED_MODEL_TYPES)})",
            )
        hidden = int(tc.hidden_size)
        heads = int(tc.num_attention_heads)
        head_dim = getattr(tc, "head_dim", None) or hidden // heads
        num_target_layers = int(tc.num_hidden_layers)
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(num_target_layers, num_draft_layers)
        vocab = int(tc.vocab_size)
        if mask_token_id is None:
            mask_token_id = vocab - 1
        theta, scaling = _rope_of(tc)
        if layer_types is not None and "sliding_attention" in layer_types and sliding_window is None:
            sliding_window = getattr(tc, "sliding_window", None)
        intermediate = getattr(tc, "intermediate_size", None)
        if intermediate is None:
            raise ConfigError(
                "intermediate_size", f"target config (model_type={mt!r}) has no intermediate_size"
            )
        return cls(
            hidden_size=hidden,
            intermediate_size=int(intermediate),
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(tc, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            vocab_size=vocab,
            num_target_layers=num_target_layers,
            target_layer_ids=list(target_layer_ids),
            mask_token_id=mask_token_id,
            num_draft_layers=num_draft_layers,
            block_size=block_size,
            rms_norm_eps=float(getattr(tc, "rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(getattr(tc, "max_position_embeddings", 32768)),
            layer_types=list(layer_types) if layer_types is not None else [],
            sliding_window=sliding_window,
            attention_bias=bool(getattr(tc, "attention_bias", False)),
            arch=arch,
            **dflash2_fields(arch, dflash2),
        )


def dflash2_fields(arch: str, given: dict[str, int | None] | None = None) -> dict[str, int | None]:
    """The four DFlash 2 fields for ``arch``: the given ones, else the published defaults; all None on
    ``"dflash"`` (a value given there is an error, raised by validation)."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    if arch != "dflash2":
        return {n: given.get(n) for n in DFLASH2_FIELDS}
    return {n: int(given.get(n, DFLASH2_DEFAULTS[n])) for n in DFLASH2_FIELDS}


def text_config_of(config: Any) -> Any:
    """The decoder config: ``config.text_config`` for multimodal configs, else ``config``."""
    get = getattr(config, "get_text_config", None)
    if callable(get):
        try:
            tc = get()
            if tc is not None:
                return tc
        except Exception:  # noqa: BLE001 - odd configs: fall back to the attribute
            pass
    return getattr(config, "text_config", None) or config


def _rope_of(tc: Any) -> tuple[float, dict | None]:
    """(rope_theta, scaling dict or None) from transformers 5 ``rope_parameters`` or 4.x fields."""
    params = getattr(tc, "rope_parameters", None)
    if isinstance(params, dict) and "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]  # per-layer-type rope (e.g. gemma-style); drafter uses full
    if not isinstance(params, dict):
        params = dict(getattr(tc, "rope_scaling", None) or {})
        if getattr(tc, "rope_theta", None) is not None:
            params["rope_theta"] = tc.rope_theta
    theta = float(params.get("rope_theta", getattr(tc, "rope_theta", None) or 10000.0))
    rtype = params.get("rope_type", params.get("type", "default"))
    if rtype in (None, "default") or rtype not in _ROPE_TYPES:
        # mrope / partial-rotary variants (multimodal targets): the drafter uses plain RoPE, as the
        # published Qwen3.5 drafters do.
        return theta, None
    scaling = {
        k: v
        for k, v in params.items()
        if k not in ("rope_theta", "type", "mrope_section", "mrope_interleaved", "partial_rotary_factor")
    }
    scaling["rope_type"] = rtype
    return theta, scaling
