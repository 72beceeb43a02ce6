"""Draft checkpoints in the published layout: loading, checking, writing (CONTRACTS C10; docs/ops.md
"Published state-dict names"; reference.state_dict for the names and shapes).

A checkpoint directory holds

    config.json                                 DFlashDraftModel / DFlash2DraftModel (reference.config)
    model.safetensors                           every tensor of the layout, BF16
  or, sharded:
    model.safetensors.index.json                {"metadata": {...}, "weight_map": {tensor: shard file}}
    model-00001-of-0000N.safetensors ...        the shards the weight map names

``load(path)`` returns a ``Checkpoint`` (the parsed ``DraftConfig``, the raw config.json dict and
the state dict as ``ml_dtypes.bfloat16`` arrays). It refuses, with a one-line ``CheckpointError``
naming the file and the tensor, anything that is not exactly the layout its config.json asks
for: a missing tensor, a tensor of another shape (the message says which config field sets it),
a dtype other than BF16, an unknown extra tensor (a layer past num_hidden_layers, a DFlash2
tensor in a DFlash checkpoint, a typo), a weight map naming a shard that is absent or a tensor
the shard lacks, a tensor stored twice. A bad config.json is refused with reference.config's
one-line ConfigError text.

``write(path, cfg, state_dict, shards=1)`` writes that layout; ``tiny_config(variant, ...)`` and
``random_checkpoint(...)`` give tiny random checkpoints of both geometries scaled down (every
ratio the spec fixes kept: GQA, five-local-one-full or all-local layers, two conv taps of group
16, a selector of rank R and top-k).

Round-level vectors carry the checkpoint inside the vector file: its tensors as inputs named
``ckpt.<tensor name>`` and config.json as the param ``config`` (``round_inputs``). An engine whose
loader reads a directory gets one with ``write_round_checkpoint(kwargs, directory)``, or the
parsed pair with ``from_round_kwargs(kwargs)``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from conformance import vectors
from reference import state_dict as sdm
from reference.config import PRESETS, ConfigError, DraftConfig, parse_config, reduced

BF16 = np.dtype(ml_dtypes.bfloat16)
CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHARD = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")
PREFIX = "ckpt."  # round-level vectors: checkpoint tensors as inputs ckpt.<name>


class CheckpointError(ValueError):
    """A refused checkpoint: ``str()`` is one line, ``<where>: <tensor or file>: <problem>``."""

    def __init__(self, where: str, what: str, problem: str):
        self.where, self.what = where, what
        super().__init__(" ".join(f"{where}: {what}: {problem}".split()))


@dataclass(frozen=True)
class Checkpoint:
    cfg: DraftConfig
    config: dict  # config.json as read
    state_dict: dict  # name -> ml_dtypes.bfloat16 array


# --- checking ---------------------------------------------------------------------------------


def _why_shape(cfg: DraftConfig, name: str) -> str:
    """Which config fields set the expected shape of ``name`` (for the refusal message)."""
    H, D = cfg.hidden_size, cfg.head_dim
    if name == "fc.weight":
        return f"hidden_size={H} x len(target_layer_ids)={len(cfg.target_layer_ids)}"
    if name.endswith(("q_proj.weight", "o_proj.weight")):
        return f"num_attention_heads={cfg.num_attention_heads} x head_dim={D}, hidden_size={H}"
    if name.endswith(("k_proj.weight", "v_proj.weight")):
        return f"num_key_value_heads={cfg.num_key_value_heads} x head_dim={D}, hidden_size={H}"
    if name.endswith(("q_norm.weight", "k_norm.weight")):
        return f"head_dim={D}"
    if ".mlp." in name and "conv" not in name:
        return f"intermediate_size={cfg.intermediate_size}, hidden_size={H}"
    if "conv" in name:
        return f"conv_kernel_size={cfg.conv_kernel_size}, hidden_size={H} / conv_group_size={cfg.conv_group_size}"
    if name.startswith(sdm.SELECTOR_PREFIX):
        return f"selector_rank={cfg.selector_rank}, vocab_size={cfg.vocab_size}, hidden_size={H}"
    return f"hidden_size={H}"


def _unknown_why(cfg: DraftConfig, name: str) -> str:
    m = re.match(r"^layers\.(\d+)\.", name)
    if m and int(m.group(1)) >= cfg.num_hidden_layers:
        return f"unknown tensor: config.json has num_hidden_layers={cfg.num_hidden_layers}"
    if cfg.variant == "dflash" and ("conv" in name or name.startswith(sdm.SELECTOR_PREFIX)):
        return "unknown tensor: a DFlash2 tensor, but config.json is a DFlashDraftModel"
    return "unknown tensor (not in the published layout for this config.json)"


def check(cfg: DraftConfig, tensors: Mapping, where: str = "checkpoint") -> None:
    """Refuse anything but exactly the layout of ``cfg`` in BF16 (first problem, in layout order;
    unknown tensors after missing and mis-shaped ones)."""
    expected = sdm.expected_shapes(cfg)
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(where, name, f"missing (expected shape {list(shape)} BF16)")
        arr = tensors[name]
        got = tuple(np.shape(arr))
        if got != shape:
            raise CheckpointError(where, name, f"has shape {list(got)}, expected {list(shape)} "
                                  f"(from config.json {_why_shape(cfg, name)})")
        dt = np.asarray(arr).dtype
        if dt != BF16:
            spelled = vectors._DTYPES.get(dt, str(dt))
            raise CheckpointError(where, name, f"has dtype {spelled}, expected BF16")
    for name in sorted(set(tensors) - set(expected)):
        raise CheckpointError(where, name, _unknown_why(cfg, name))


# --- reading ----------------------------------------------------------------------------------


def _read_safetensors(path: Path, where: str) -> dict[str, np.ndarray]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(where, path.name, f"cannot be read ({exc.strerror or exc})") from None
    try:
        tensors, _ = vectors.decode(data, path.name)
    except vectors.InputError as exc:
        raise CheckpointError(where, path.name, str(exc).split(": ", 1)[-1]) from None
    return {k: np.array(v) for k, v in tensors.items()}


def _read_index(root: Path, where: str) -> dict[str, np.ndarray]:
    try:
        index = json.loads((root / INDEX).read_text())
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map must map tensor names to file names")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(where, INDEX, f"not a safetensors index ({type(exc).__name__}: {exc})") from None
    files = sorted(set(weight_map.values()))
    totals = set()
    for f in files:
        m = SHARD.match(f)
        if not m:
            raise CheckpointError(where, INDEX, f"names shard {f!r}, expected model-0000i-of-0000n.safetensors")
        totals.add(int(m.group(2)))
    if len(totals) > 1:
        raise CheckpointError(where, INDEX, f"shards disagree on their count ({sorted(totals)})")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        if not (root / f).is_file():
            name = min(k for k, v in weight_map.items() if v == f)
            raise CheckpointError(where, name, f"its shard {f} (named in {INDEX}) is missing")
        shard = _read_safetensors(root / f, where)
        for name in sorted(shard):
            if name not in weight_map:
                raise CheckpointError(where, name, f"stored in {f} but not listed in {INDEX}")
            if weight_map[name] != f:
                raise CheckpointError(where, name, f"stored in {f}, but {INDEX} maps it to {weight_map[name]}")
            if name in tensors:
                raise CheckpointError(where, name, "stored twice")
            tensors[name] = shard[name]
        for name in sorted(k for k, v in weight_map.items() if v == f):
            if name not in shard:
                raise CheckpointError(where, name, f"{INDEX} maps it to {f}, which does not hold it")
    return tensors


def load(path, *, K: int | None = None, B: int | None = None) -> Checkpoint:
    """A checkpoint directory in the published layout (module docstring); CheckpointError if not."""
    root = Path(path)
    where = f"checkpoint {root}"
    if not root.is_dir():
        raise CheckpointError(where, "directory", "does not exist")
    try:
        raw = json.loads((root / CONFIG).read_text())
    except OSError:
        raise CheckpointError(where, CONFIG, "missing") from None
    except ValueError as exc:
        raise CheckpointError(where, CONFIG, f"not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(where, CONFIG, f"a JSON {type(raw).__name__}, expected an object")
    try:
        cfg = parse_config(raw, str(root / CONFIG), K=K, B=B)
    except ConfigError as exc:
        raise CheckpointError(where, f"{CONFIG} {exc.field}", exc.problem) from None
    single, index = (root / SINGLE).is_file(), (root / INDEX).is_file()
    if single and index:
        raise CheckpointError(where, SINGLE, f"both {SINGLE} and {INDEX} are present: which one holds the weights?")
    if not single and not index:
        raise CheckpointError(where, SINGLE, f"missing (and no {INDEX})")
    tensors = _read_safetensors(root / SINGLE, where) if single else _read_index(root, where)
    check(cfg, tensors, where)
    return Checkpoint(cfg, raw, {k: tensors[k] for k in sdm.expected_shapes(cfg)})


# --- writing ----------------------------------------------------------------------------------


def write(path, cfg: DraftConfig, state_dict: Mapping, *, shards: int = 1, config: dict | None = None,
          check_first: bool = True) -> Path:
    """Write config.json and the tensors (one file, or ``shards`` files with their index).

    ``config``: the config.json dict to write (default ``cfg.to_dict()``). ``check_first=False``
    writes whatever it is given (the tests' malformed checkpoints)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    if check_first:
        check(cfg, state_dict, f"writing {root}")
    (root / CONFIG).write_text(json.dumps(cfg.to_dict() if config is None else config, indent=1, sort_keys=True)
                               + "\n")
    names = list(state_dict)
    meta = {"format": "pt"}
    if shards <= 1:
        (root / SINGLE).write_bytes(vectors.encode({k: np.asarray(state_dict[k]) for k in names}, meta))
        return root
    parts = [names[i::shards] for i in range(shards)]
    weight_map, total = {}, 0
    for i, part in enumerate(parts):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        (root / fname).write_bytes(vectors.encode({k: np.asarray(state_dict[k]) for k in part}, meta))
        for k in part:
            weight_map[k] = fname
            total += np.asarray(state_dict[k]).nbytes
    (root / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                         indent=1, sort_keys=True) + "\n")
    return root


def tiny_config(variant: str, *, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                head_dim: int = 8, intermediate: int = 64, window: int = 8, vocab: int = 64, rank: int = 8,
                top_k: int = 8, target_layer_ids=(1, 3), num_target_layers: int = 4, K: int = 3, B: int = 1,
                mask_token_id: int | None = None, output_multiplier: float | None = None,
                softcap: float | None = None) -> DraftConfig:
    """Both official geometries scaled down: DFlash keeps "local layers, then one full layer",
    DFlash2 all-local layers with its conv and selector (rank, top-k)."""
    preset = PRESETS["qwen3.5-35b-a3b-dflash" if variant == "dflash" else "qwen3.5-27b-dflash2"]
    extra = {} if variant == "dflash" else {"rank": rank, "top_k": top_k}
    cfg = reduced(preset, hidden=hidden, layers=layers, intermediate=intermediate, heads=heads, kv_heads=kv_heads,
                  head_dim=head_dim, window=window, vocab=vocab, target_layer_ids=list(target_layer_ids),
                  num_target_layers=num_target_layers, mask_token_id=mask_token_id, K=K, B=B, **extra)
    if output_multiplier is not None or softcap is not None:
        raw = cfg.to_dict()
        if output_multiplier is not None:
            raw["dflash_config"]["output_multiplier"] = float(output_multiplier)
        if softcap is not None:
            raw["dflash_config"]["final_logit_softcapping"] = float(softcap)
        cfg = parse_config(raw, cfg.source, K=K, B=B)
    return cfg


def random_checkpoint(path, variant: str = "dflash", seed: int = 0, *, shards: int = 1, **geometry) -> Checkpoint:
    """Write a tiny random checkpoint (``tiny_config`` geometry) and load it back."""
    cfg = tiny_config(variant, **geometry)
    sd = sdm.random_state_dict(cfg, np.random.default_rng(seed))
    write(path, cfg, sd, shards=shards)
    return load(path, K=cfg.K, B=cfg.B)


# --- the checkpoint inside a round-level vector -----------------------------------------------


def round_inputs(cfg: DraftConfig, state_dict: Mapping) -> tuple[dict[str, np.ndarray], dict]:
    """(inputs ``ckpt.<name>``, the ``config`` param) of a round-level case."""
    check(cfg, state_dict, "round checkpoint")
    return {PREFIX + k: np.asarray(state_dict[k]) for k in sdm.expected_shapes(cfg)}, cfg.to_dict()


def from_round_kwargs(kwargs: Mapping, *, K: int | None = None, B: int | None = None
                      ) -> tuple[DraftConfig, dict[str, np.ndarray]]:
    """(DraftConfig, state dict) from a round-level call's keyword arguments (checked)."""
    if "config" not in kwargs:
        raise CheckpointError("round inputs", CONFIG, "no 'config' argument")
    try:
        cfg = parse_config(kwargs["config"], "round config", K=K, B=B)
    except ConfigError as exc:
        raise CheckpointError("round inputs", f"{CONFIG} {exc.field}", exc.problem) from None
    sd = {k[len(PREFIX):]: v for k, v in kwargs.items() if k.startswith(PREFIX)}
    # callers that pass BF16 as uint16 bit patterns (the CuPy convention)
    sd = {k: np.asarray(v).view(BF16) if np.asarray(v).dtype == np.uint16 else v for k, v in sd.items()}
    check(cfg, sd, "round inputs")
    return cfg, sd


def write_round_checkpoint(kwargs: Mapping, directory, *, shards: int = 1) -> Path:
    """The checkpoint of a round-level call written as a directory in the published layout."""
    cfg, sd = from_round_kwargs(kwargs)
    sd = {k: np.asarray(v) for k, v in sd.items()}
    return write(directory, dataclasses.replace(cfg), sd, shards=shards, config=dict(kwargs["config"]))


def checkpoint_names(max_layers: int = 4) -> tuple[str, ...]:
    """Every ``ckpt.<name>`` a round-level case may hold (both variants, up to ``max_layers``)."""
    names = ["norm.weight", "fc.weight", "hidden_norm.weight", sdm.HIDDEN_PROJECTION, sdm.PREDECESSOR,
             sdm.SUCCESSOR]
    for n in range(max_layers):
        names += [sdm.layer_key(n, s) for s in (*sdm.LAYER_KEYS.values(), *sdm.CONV_KEYS.values())]
    return tuple(PREFIX + n for n in names)
