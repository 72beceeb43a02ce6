"""Draft config.json for DFlashDraftModel / DFlash2DraftModel (spec: "Both draft
configs use model_type=qwen3"; docs/ops.md "config"; CONTRACTS C7 for the ring size).

``parse_config(raw, source)`` turns a decoded config.json into a frozen
``DraftConfig``; ``load_config(path)`` reads the file first. Anything the toolkit
cannot honour exactly is refused with a ``ConfigError`` whose message is one line
``<source>: <field>: <problem>``.

Spellings. The DFlash fields (``DFLASH_FIELDS``: block_size, target_layer_ids,
mask_token_id, num_target_layers, is_causal, conv_*, selector_*,
output_multiplier, final_logit_softcapping, input_embedding_scale) are read from
``dflash_config.X`` or from the top level; both present with different values is
refused naming the field (upstream silently prefers one: z-lab/dflash
``_draft_value`` the nested one). RoPE theta is ``rope_parameters.rope_theta``
(transformers 5) or flat ``rope_theta``, under the same rule.

Resolution rules, with their upstream source:

- ``layer_types`` absent: transformers ``Qwen3Config.__post_init__``
  (models/qwen3/configuration_qwen3.py), which both z-lab/dflash and SpecForge
  build on: the effective window is ``sliding_window if use_sliding_window else
  None`` (use_sliding_window defaults to false, max_window_layers to 28) and
  layer i is "sliding_attention" iff that window is not None and
  i >= max_window_layers, else "full_attention".
- A sliding layer with no effective window is refused (naming use_sliding_window
  when the window was nulled by it, else sliding_window), as SpecForge
  ``resolve_dflash_attention_layout`` does; z-lab/dflash would instead run such a
  layer unwindowed.
- ``target_layer_ids`` absent: SpecForge ``DFlashDraftModel.__init__``
  (specforge/modeling/draft/dflash.py) uses
  ``build_target_layer_ids(num_target_layers, num_hidden_layers)``: one draft
  layer -> [num_target_layers // 2]; otherwise ids spread evenly over [1, n - 3],
  ``int(round(1 + i * (n - 4) / (L - 1)))`` for i < L (Python round, half to
  even). z-lab/dflash refuses a config without them. Needs num_target_layers.
- ``mask_token_id`` absent: no upstream default (both read it as None), so it is
  None here and the caller must supply the mask token id.
- ``block_size`` absent: 16, z-lab/dflash's default.
- ``num_key_value_heads`` absent or null: num_attention_heads (Qwen3Config).
- ``head_dim``, ``rms_norm_eps`` and RoPE theta have no agreed default upstream
  (Qwen3Config says head_dim 128, the attention code falls back to H / heads):
  they are required.
- ``is_causal`` is recorded as given. The spec's draft attention is non-causal on
  every layer, so ``is_causal: true`` is refused; absent is accepted, but z-lab
  then runs sliding layers causally (docs/pitfalls.md), listed by
  ``DraftConfig.upstream_causal_layers``.

Refused by name because they change the math the toolkit implements:
attention_sink_bias, attention_bias or mlp_bias true; hidden_act other than silu;
rope_scaling non-null; rope_type other than "default"; any other rope_parameters
key (partial rotation, MRoPE sections); use_qk_norm false; conv_kernel_size != 2;
conv_group_size != 16; input_embedding_scale != 1 (z-lab scales the block
embedding by it); SpecForge's dflash_config attention_mode(s) other than gqa,
projector_type, pure_draft_prefix_len != 0 and shift_label true.

Startup (spec: "K in 1..15 and concurrency B in 1..8"): K defaults to
block_size - 1 and B to 1; W = K + 1. ``windows`` gives S for a sliding layer and
0 for a full one; ``full_pool`` is true when any layer is full (spec: "A full
pool exists only when ..."); ``ring_bytes()`` = local layers x (2 + 2) x Hk x D x S
(C7; 40 MiB for the 27B DFlash2).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

K_RANGE = (1, 15)
B_RANGE = (1, 8)
CONV_KERNEL_SIZE = 2
CONV_GROUP_SIZE = 16
DEFAULT_BLOCK_SIZE = 16  # z-lab/dflash DFlashDraftModel
DEFAULT_MAX_WINDOW_LAYERS = 28  # transformers Qwen3Config
SLIDING = "sliding_attention"
FULL = "full_attention"
ARCHITECTURES = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}
DFLASH_FIELDS = (
    "block_size",
    "target_layer_ids",
    "mask_token_id",
    "num_target_layers",
    "is_causal",
    "conv_kernel_size",
    "conv_group_size",
    "selector_rank",
    "selector_top_k",
    "output_multiplier",
    "final_logit_softcapping",
    "input_embedding_scale",
)
_ROPE_PARAMETER_KEYS = {"rope_theta", "rope_type", "partial_rotary_factor"}


class ConfigError(ValueError):
    """A refused config: ``str()`` is one line ``<source>: <field>: <problem>``."""

    def __init__(self, source: str, field_name: str, problem: str):
        self.source = source
        self.field = field_name
        self.problem = problem
        super().__init__(" ".join(f"{source}: {field_name}: {problem}".split()))


@dataclass(frozen=True)
class DraftConfig:
    """A validated draft geometry plus the startup choices K and B.

    Equality ignores ``source``, so the same geometry read from two spellings
    compares equal.
    """

    variant: str  # "dflash" | "dflash2"
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    layer_types: tuple[str, ...]
    sliding_window: int | None  # S; None when no layer is sliding
    target_layer_ids: tuple[int, ...]
    mask_token_id: int | None  # None: the caller supplies it
    block_size: int
    vocab_size: int
    num_target_layers: int | None
    is_causal: bool | None  # as given; only False or absent is accepted
    conv_kernel_size: int | None = None  # DFlash2 only
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None
    output_multiplier: float | None = None  # None: absent (identity)
    final_logit_softcapping: float | None = None  # None: off
    K: int = 1
    B: int = 1
    source: str = field(default="<config>", compare=False)

    @property
    def W(self) -> int:
        """Physical block width: one anchor plus K masks."""
        return self.K + 1

    @property
    def windows(self) -> tuple[int, ...]:
        """Per layer: S for a sliding layer, 0 for a full layer."""
        return tuple(self.sliding_window if t == SLIDING else 0 for t in self.layer_types)

    @property
    def local_layers(self) -> int:
        return sum(t == SLIDING for t in self.layer_types)

    @property
    def full_pool(self) -> bool:
        """A paged full-attention pool exists only when some layer is full."""
        return any(t == FULL for t in self.layer_types)

    @property
    def upstream_causal_layers(self) -> tuple[int, ...]:
        """Layers z-lab/dflash would run causally (is_causal absent: the sliding ones).

        The toolkit runs every draft layer non-causally; this only flags the pitfall.
        """
        if self.is_causal is not None:
            return ()
        return tuple(i for i, t in enumerate(self.layer_types) if t == SLIDING)

    def ring_bytes(self) -> int:
        """C7 ring payload of one state image: local layers x (2 B K + 2 B V) x Hk x D x S."""
        if not self.local_layers:
            return 0
        return self.local_layers * (2 + 2) * self.num_key_value_heads * self.head_dim * self.sliding_window

    def with_startup(self, *, K: int | None = None, B: int | None = None) -> DraftConfig:
        """The same geometry with other startup K / B (validated as in parse_config)."""
        K = self.K if K is None else K
        B = self.B if B is None else B
        _check_startup(self.source, K, B)
        return dataclasses.replace(self, K=K, B=B)

    def to_dict(self) -> dict[str, Any]:
        """A config.json dict (nested dflash_config spelling) that parse_config maps back to self."""
        raw: dict[str, Any] = {
            "architectures": [next(a for a, v in ARCHITECTURES.items() if v == self.variant)],
            "model_type": "qwen3",
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "layer_types": list(self.layer_types),
            "use_sliding_window": self.sliding_window is not None,
            "sliding_window": self.sliding_window,
            "vocab_size": self.vocab_size,
        }
        nested: dict[str, Any] = {"block_size": self.block_size, "target_layer_ids": list(self.target_layer_ids)}
        optional = {
            "mask_token_id": self.mask_token_id,
            "num_target_layers": self.num_target_layers,
            "is_causal": self.is_causal,
            "conv_kernel_size": self.conv_kernel_size,
            "conv_group_size": self.conv_group_size,
            "selector_rank": self.selector_rank,
            "selector_top_k": self.selector_top_k,
            "output_multiplier": self.output_multiplier,
            "final_logit_softcapping": self.final_logit_softcapping,
        }
        nested.update({k: v for k, v in optional.items() if v is not None})
        raw["dflash_config"] = nested
        return raw


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Upstream default target block ids (SpecForge / z-lab ``build_target_layer_ids``).

    One draft layer: [n // 2]. Otherwise L ids spread over [1, n - 3]:
    ``int(round(1 + i * (n - 4) / (L - 1)))``, Python's half-to-even round.
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [round(start + (i * span) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


# -- field readers ---------------------------------------------------------------------------------


def _typename(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _same(a: Any, b: Any) -> bool:
    # numbers by value (10000000 and 1e7 agree); everything else by its JSON text
    if _is_number(a) and _is_number(b):
        return a == b
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class _Reader:
    """Reads typed fields out of one raw config, raising ConfigError naming the field."""

    def __init__(self, raw: Mapping[str, Any], source: str):
        if not isinstance(raw, Mapping):
            raise ConfigError(source, "<root>", f"expected a JSON object, got {_typename(raw)}")
        self.raw = raw
        self.source = source
        nested = raw.get("dflash_config")
        if nested is None:
            nested = {}
        if not isinstance(nested, Mapping):
            self.fail("dflash_config", f"expected an object, got {_typename(nested)}")
        self.nested = nested

    def fail(self, name: str, problem: str):
        raise ConfigError(self.source, name, problem)

    def get(self, name: str) -> tuple[str, Any]:
        """(spelling, value) of a top-level field; value is None when absent."""
        return name, self.raw.get(name)

    def get_dflash(self, name: str) -> tuple[str, Any]:
        """(spelling, value) of a DFlash field, nested or flat; conflicting spellings are refused."""
        flat, nested = self.raw.get(name), self.nested.get(name)
        if flat is not None and nested is not None and not _same(flat, nested):
            self.fail(name, f"dflash_config.{name} = {_short(nested)} and {name} = {_short(flat)} disagree")
        if nested is not None:
            return f"dflash_config.{name}", nested
        return name, flat

    def int_(self, spelled: tuple[str, Any], *, lo: int | None = None, hi: int | None = None, required=True):
        name, v = spelled
        if v is None:
            if required:
                self.fail(name, "missing")
            return None
        if not _is_int(v):
            self.fail(name, f"expected int, got {_typename(v)}")
        if lo is not None and v < lo:
            self.fail(name, f"{v} is below {lo}")
        if hi is not None and v > hi:
            self.fail(name, f"{v} is above {hi}")
        return v

    def positive_float(self, spelled: tuple[str, Any], *, required=True) -> float | None:
        name, v = spelled
        if v is None:
            if required:
                self.fail(name, "missing")
            return None
        if not _is_number(v):
            self.fail(name, f"expected a number, got {_typename(v)}")
        if not (math.isfinite(v) and v > 0):
            self.fail(name, f"expected a finite number > 0, got {_short(v)}")
        return float(v)

    def bool_(self, spelled: tuple[str, Any]) -> bool | None:
        name, v = spelled
        if v is not None and not isinstance(v, bool):
            self.fail(name, f"expected bool, got {_typename(v)}")
        return v


# -- the parser ------------------------------------------------------------------------------------


def _variant(r: _Reader) -> str:
    name, archs = r.get("architectures")
    if archs is None:
        r.fail(name, "missing")
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        r.fail(name, f"expected a list of str, got {_typename(archs)}")
    known = [a for a in archs if a in ARCHITECTURES]
    if len(archs) != 1 or len(known) != 1:
        r.fail(name, f"expected exactly one of {sorted(ARCHITECTURES)}, got {_short(archs)}")
    model_type = r.raw.get("model_type")
    if model_type != "qwen3":
        r.fail("model_type", f"expected 'qwen3', got {_short(model_type)}")
    return ARCHITECTURES[known[0]]


def _refuse_unsupported(r: _Reader) -> None:
    """Keys that would change the math the toolkit implements."""
    for key in ("attention_sink_bias", "attention_bias", "mlp_bias"):
        if r.bool_(r.get(key)):
            r.fail(key, "true is not supported (the spec's projections and attention have no bias or sink)")
    act = r.raw.get("hidden_act")
    if act is not None and act != "silu":
        r.fail("hidden_act", f"only 'silu' is supported, got {_short(act)}")
    if r.raw.get("rope_scaling") is not None:
        r.fail("rope_scaling", "must be null or absent (the spec's RoPE is plain one-dimensional)")
    if r.bool_(r.get("use_qk_norm")) is False:
        r.fail("use_qk_norm", "false is not supported (the spec normalizes Q and K per head)")
    prf = r.raw.get("partial_rotary_factor")
    if prf is not None and not (_is_number(prf) and prf == 1):  # true == 1 in Python: refuse booleans too
        r.fail("partial_rotary_factor", f"only 1 (full-head RoPE) is supported, got {_short(prf)}")
    _, scale = r.get_dflash("input_embedding_scale")
    if scale is not None and not (_is_number(scale) and scale == 1):
        r.fail(r.get_dflash("input_embedding_scale")[0], f"only 1 is supported, got {_short(scale)}")
    # SpecForge dflash_config extensions (specforge/modeling/draft/dflash.py)
    for key in ("attention_mode", "attention_modes"):
        modes = r.nested.get(key)
        if modes is not None:
            values = modes if isinstance(modes, list) else [modes]
            if any(str(m).lower() != "gqa" for m in values):
                r.fail(f"dflash_config.{key}", f"only 'gqa' attention is supported, got {_short(modes)}")
    if r.nested.get("projector_type") is not None:
        r.fail("dflash_config.projector_type", f"not supported, got {_short(r.nested['projector_type'])}")
    prefix = r.nested.get("pure_draft_prefix_len")
    if prefix not in (None, 0):
        r.fail("dflash_config.pure_draft_prefix_len", f"only 0 is supported, got {_short(prefix)}")
    if r.nested.get("shift_label") not in (None, False):
        r.fail("dflash_config.shift_label", "true is not supported (mask output i predicts position F+i, no shift)")


def _rope_theta(r: _Reader) -> float:
    params = r.raw.get("rope_parameters")
    nested = None
    if params is not None:
        if not isinstance(params, Mapping):
            r.fail("rope_parameters", f"expected an object, got {_typename(params)}")
        for key in params:
            if key not in _ROPE_PARAMETER_KEYS:
                r.fail(f"rope_parameters.{key}", "not supported (the spec's RoPE is plain one-dimensional)")
        rope_type = params.get("rope_type")
        if rope_type is not None and rope_type != "default":
            r.fail("rope_parameters.rope_type", f"only 'default' is supported, got {_short(rope_type)}")
        prf = params.get("partial_rotary_factor")
        if prf is not None and not (_is_number(prf) and prf == 1):
            r.fail("rope_parameters.partial_rotary_factor", f"only 1 is supported, got {_short(prf)}")
        nested = params.get("rope_theta")
    flat = r.raw.get("rope_theta")
    if nested is not None and flat is not None and not _same(nested, flat):
        r.fail("rope_theta", f"rope_parameters.rope_theta = {_short(nested)} and rope_theta = {_short(flat)} disagree")
    if nested is not None:
        return r.positive_float(("rope_parameters.rope_theta", nested))
    return r.positive_float(("rope_theta", flat))


def _layout(r: _Reader, n_layers: int) -> tuple[tuple[str, ...], int | None]:
    """(layer_types, S) with the Qwen3Config resolution described in the module docstring."""
    use_sw = r.bool_(r.get("use_sliding_window"))
    window = r.int_(r.get("sliding_window"), lo=1, required=False)
    effective = window if use_sw else None
    name, types = r.get("layer_types")
    if types is None:
        first = r.int_(r.get("max_window_layers"), lo=0, required=False)
        first = DEFAULT_MAX_WINDOW_LAYERS if first is None else first
        types = [SLIDING if effective is not None and i >= first else FULL for i in range(n_layers)]
    if not isinstance(types, list):
        r.fail(name, f"expected a list, got {_typename(types)}")
    if len(types) != n_layers:
        r.fail(name, f"has {len(types)} entries, num_hidden_layers is {n_layers}")
    for i, t in enumerate(types):
        if t not in (SLIDING, FULL):
            r.fail(f"{name}[{i}]", f"expected {SLIDING!r} or {FULL!r}, got {_short(t)}")
    if SLIDING not in types:
        return tuple(types), None
    if effective is None:
        if window is not None:
            r.fail("use_sliding_window", "false or absent nulls sliding_window (Qwen3Config) but layers are sliding")
        r.fail("sliding_window", "missing, but layer_types has sliding_attention layers")
    return tuple(types), effective


def _target_layer_ids(r: _Reader, n_layers: int, n_target: int | None) -> tuple[int, ...]:
    name, ids = r.get_dflash("target_layer_ids")
    if ids is None:
        if n_target is None:
            r.fail(name, "missing, and num_target_layers is missing too (needed for the upstream default)")
        ids = build_target_layer_ids(n_target, n_layers)
        name = f"target_layer_ids (default for num_target_layers={n_target})"
    if not isinstance(ids, list) or not ids:
        r.fail(name, f"expected a non-empty list of int, got {_short(ids)}")
    for i, v in enumerate(ids):
        r.int_((f"{name}[{i}]", v), lo=0, hi=None if n_target is None else n_target - 1)
    return tuple(ids)


def _check_startup(source: str, K: Any, B: Any) -> None:
    if not _is_int(K):
        raise ConfigError(source, "K", f"expected int, got {_typename(K)}")
    if not K_RANGE[0] <= K <= K_RANGE[1]:
        raise ConfigError(source, "K", f"{K} is outside {K_RANGE[0]}..{K_RANGE[1]}")
    if not _is_int(B):
        raise ConfigError(source, "B", f"expected int, got {_typename(B)}")
    if not B_RANGE[0] <= B <= B_RANGE[1]:
        raise ConfigError(source, "B", f"{B} is outside {B_RANGE[0]}..{B_RANGE[1]}")


def parse_config(raw: Mapping[str, Any], source: str = "<config>", *, K: int | None = None, B: int | None = None):
    """A decoded config.json -> DraftConfig (rules in the module docstring); ConfigError on refusal."""
    r = _Reader(raw, source)
    variant = _variant(r)
    _refuse_unsupported(r)

    hidden = r.int_(r.get("hidden_size"), lo=1)
    n_layers = r.int_(r.get("num_hidden_layers"), lo=1)
    intermediate = r.int_(r.get("intermediate_size"), lo=1)
    heads = r.int_(r.get("num_attention_heads"), lo=1)
    kv_heads = r.int_(r.get("num_key_value_heads"), lo=1, required=False) or heads
    if heads % kv_heads:
        r.fail("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads {heads}")
    head_dim = r.int_(r.get("head_dim"), lo=2)
    if head_dim % 2:
        r.fail("head_dim", f"{head_dim} is odd (split-half RoPE needs an even head dim)")
    eps = r.positive_float(r.get("rms_norm_eps"))
    theta = _rope_theta(r)
    vocab = r.int_(r.get("vocab_size"), lo=1)
    layer_types, window = _layout(r, n_layers)

    n_target = r.int_(r.get_dflash("num_target_layers"), lo=1, required=False)
    ids = _target_layer_ids(r, n_layers, n_target)
    mask = r.int_(r.get_dflash("mask_token_id"), lo=0, hi=vocab - 1, required=False)
    block_spelled = r.get_dflash("block_size")
    block = r.int_(block_spelled, lo=2, required=False) or DEFAULT_BLOCK_SIZE
    is_causal = r.bool_(r.get_dflash("is_causal"))
    if is_causal:
        r.fail(r.get_dflash("is_causal")[0], "true is not supported (the spec's draft attention is non-causal)")
    multiplier = r.positive_float(r.get_dflash("output_multiplier"), required=False)
    cap_name, cap = r.get_dflash("final_logit_softcapping")
    if cap is not None and not (_is_number(cap) and cap == 0):
        cap = r.positive_float((cap_name, cap))  # 0 and null both mean off, as upstream
    else:
        cap = None

    extra: dict[str, Any] = {}
    if variant == "dflash2":
        taps = r.int_(r.get_dflash("conv_kernel_size"))
        if taps != CONV_KERNEL_SIZE:
            r.fail(r.get_dflash("conv_kernel_size")[0], f"only {CONV_KERNEL_SIZE} taps are supported, got {taps}")
        group = r.int_(r.get_dflash("conv_group_size"))
        if group != CONV_GROUP_SIZE:
            r.fail(r.get_dflash("conv_group_size")[0], f"only group width {CONV_GROUP_SIZE} is supported, got {group}")
        if hidden % group:
            r.fail("hidden_size", f"{hidden} is not a multiple of conv_group_size {group}")
        extra = {
            "conv_kernel_size": taps,
            "conv_group_size": group,
            "selector_rank": r.int_(r.get_dflash("selector_rank"), lo=1),
            "selector_top_k": r.int_(r.get_dflash("selector_top_k"), lo=1, hi=vocab),
        }

    if K is None:
        K = block - 1
        if not K_RANGE[0] <= K <= K_RANGE[1]:
            raise ConfigError(
                source, "K", f"default K = {block_spelled[0]} - 1 = {K} is outside {K_RANGE[0]}..{K_RANGE[1]}; pass K"
            )
    B = 1 if B is None else B
    _check_startup(source, K, B)

    return DraftConfig(
        variant=variant,
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=eps,
        rope_theta=theta,
        layer_types=layer_types,
        sliding_window=window,
        target_layer_ids=ids,
        mask_token_id=mask,
        block_size=block,
        vocab_size=vocab,
        num_target_layers=n_target,
        is_causal=is_causal,
        output_multiplier=multiplier,
        final_logit_softcapping=cap,
        K=K,
        B=B,
        source=source,
        **extra,
    )


def load_config(path: str | Path, *, K: int | None = None, B: int | None = None) -> DraftConfig:
    """Read and parse one config.json; errors name the file (its base name) and the field."""
    path = Path(path)
    source = path.name
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(source, "<json>", f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    return parse_config(raw, source, K=K, B=B)


# -- presets from the spec's table -----------------------------------------------------------------

# vocab_size 248320 and mask_token_id 248070 are assumptions for both (the published
# 27B DFlash2 configs carry them; the table does not). block_size 16 for the 35B-A3B
# DFlash (z-lab's default) and 8 for the 27B DFlash2 (published) are assumptions too,
# as are num_target_layers 40 (the 35B-A3B ids equal build_target_layer_ids(40, 8)) and 64.
_PRESET_RAW: dict[str, dict[str, Any]] = {
    "qwen3.5-35b-a3b-dflash": {
        "architectures": ["DFlashDraftModel"],
        "hidden_size": 2048,
        "num_hidden_layers": 6,
        "intermediate_size": 6144,
        "layer_types": [SLIDING] * 5 + [FULL],
        "sliding_window": 4096,
        "dflash_config": {
            "block_size": 16,
            "target_layer_ids": [1, 6, 11, 16, 22, 27, 32, 37],
            "num_target_layers": 40,
        },
    },
    "qwen3.5-27b-dflash2": {
        "architectures": ["DFlash2DraftModel"],
        "hidden_size": 5120,
        "num_hidden_layers": 5,
        "intermediate_size": 17408,
        "layer_types": [SLIDING] * 5,
        "sliding_window": 2048,
        "dflash_config": {
            "block_size": 8,
            "target_layer_ids": [5, 19, 33, 47, 61],
            "num_target_layers": 64,
            "conv_kernel_size": 2,
            "conv_group_size": 16,
            "selector_rank": 256,
            "selector_top_k": 16,
        },
    },
}
_PRESET_COMMON = {
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 10_000_000, "rope_type": "default"},
    "use_sliding_window": True,
    "is_causal": False,
    "vocab_size": 248320,
}


def _preset(name: str) -> DraftConfig:
    raw = {**_PRESET_COMMON, **_PRESET_RAW[name]}
    raw["dflash_config"] = {**raw["dflash_config"], "mask_token_id": 248070}
    return parse_config(raw, f"preset:{name}")


PRESETS: dict[str, DraftConfig] = {name: _preset(name) for name in _PRESET_RAW}


def reduced(
    config: DraftConfig,
    *,
    hidden: int | None = None,
    layers: int | None = None,
    intermediate: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    window: int | None = None,
    vocab: int | None = None,
    rank: int | None = None,
    top_k: int | None = None,
    layer_types: list[str] | None = None,
    target_layer_ids: list[int] | None = None,
    num_target_layers: int | None = None,
    mask_token_id: int | None = None,
    K: int | None = None,
    B: int | None = None,
) -> DraftConfig:
    """A smaller geometry for tests, validated like any config.

    ``layers`` without ``layer_types`` keeps the first layers - 1 types and the
    last one, so a "five local then one full" pattern keeps its full layer. A
    ``vocab`` that no longer holds the mask id moves it to vocab - 1 unless
    ``mask_token_id`` is given.
    """
    raw = config.to_dict()
    nested = raw["dflash_config"]
    top = {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "sliding_window": window if config.sliding_window is not None else None,
        "vocab_size": vocab,
    }
    raw.update({k: v for k, v in top.items() if v is not None})
    if layers is not None:
        raw["num_hidden_layers"] = layers
        if layer_types is None:
            layer_types = list(config.layer_types[: max(layers - 1, 0)]) + [config.layer_types[-1]]
    if layer_types is not None:
        raw["layer_types"] = list(layer_types)
        if SLIDING in layer_types and raw["sliding_window"] is None:
            raw["sliding_window"] = window
            raw["use_sliding_window"] = True
    sub = {
        "selector_rank": rank,
        "selector_top_k": top_k,
        "target_layer_ids": target_layer_ids,
        "num_target_layers": num_target_layers,
        "mask_token_id": mask_token_id,
    }
    nested.update({k: v for k, v in sub.items() if v is not None})
    if vocab is not None and mask_token_id is None and nested.get("mask_token_id", 0) >= vocab:
        nested["mask_token_id"] = vocab - 1
    return parse_config(
        raw, f"reduced({config.source})", K=config.K if K is None else K, B=config.B if B is None else B
    )
