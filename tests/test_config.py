"""reference.config: published files, the spec's table, refusals by name, spellings."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.config import (
    DFLASH_FIELDS,
    FULL,
    PRESETS,
    SLIDING,
    ConfigError,
    build_target_layer_ids,
    load_config,
    parse_config,
    reduced,
)

FIXTURES = Path(__file__).parent / "data" / "configs"
# The published draft config.json files, copied byte for byte (field names, nesting and value
# spellings as released), so that a clone with nothing beside it tests them.
PUBLISHED = (
    "SpecForge_qwen3-8b-dflash.config.json",
    "SpecForge_qwen3.6-27b-dflash2.config.json",
    "z-lab_Qwen3.8-27B-DFlash2.config.json",
)
# Optional extra check: a directory holding the originals (set by a CI job that has them); the
# copies above must equal them byte for byte. Unset, the copies stand on their own.
ORIGINALS_ENV = "DFLASH_PUBLISHED_CONFIGS"
DFLASH2_FILE = "z-lab_Qwen3.8-27B-DFlash2.config.json"
DFLASH_FILE = "SpecForge_qwen3-8b-dflash.config.json"
MiB = 2**20


def fixture(name: str) -> dict:
    """A published config (a byte-for-byte copy under tests/data/configs)."""
    return json.loads((FIXTURES / name).read_text())


# -- published files and the spec's table -------------------------------------------------------


@pytest.mark.parametrize("path", [FIXTURES / n for n in PUBLISHED], ids=lambda p: p.name)
def test_every_published_file_parses(path):
    cfg = load_config(path)
    assert cfg.source == path.name
    assert cfg.variant in ("dflash", "dflash2")
    assert len(cfg.layer_types) == cfg.num_hidden_layers
    assert cfg.W == cfg.K + 1 == cfg.block_size
    assert cfg.B == 1
    assert parse_config(cfg.to_dict(), K=cfg.K) == cfg


@pytest.mark.parametrize("name", ["SpecForge_qwen3.6-27b-dflash2.config.json", DFLASH2_FILE])
def test_27b_dflash2_files_have_the_tables_geometry(name):
    cfg = load_config(FIXTURES / name)
    assert cfg.variant == "dflash2"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (5120, 5, 17408)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 8, 128)
    assert cfg.layer_types == (SLIDING,) * 5 and cfg.sliding_window == 2048
    assert cfg.windows == (2048,) * 5 and not cfg.full_pool
    assert cfg.target_layer_ids == (5, 19, 33, 47, 61)
    assert (cfg.rms_norm_eps, cfg.rope_theta) == (1e-6, 1e7)
    assert (cfg.conv_kernel_size, cfg.conv_group_size) == (2, 16)
    assert (cfg.selector_rank, cfg.selector_top_k) == (256, 16)
    assert cfg.ring_bytes() == 40 * MiB
    assert cfg.is_causal is False and cfg.upstream_causal_layers == ()


def test_specforge_8b_uses_upstream_defaults():
    cfg = load_config(FIXTURES / DFLASH_FILE)
    # build_target_layer_ids(36, 5): 1 + i * 32 / 4
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33)
    assert cfg.mask_token_id is None  # no upstream default: the caller supplies it
    assert cfg.layer_types == (FULL,) * 5 and cfg.sliding_window is None
    assert cfg.windows == (0,) * 5 and cfg.full_pool and cfg.ring_bytes() == 0
    assert (cfg.K, cfg.rope_theta) == (15, 1e6)


def test_fixtures_are_the_published_files():
    """The copies are exactly the published set; where the originals are at hand (ORIGINALS_ENV),
    each copy equals its original byte for byte and no original lacks a copy."""
    assert sorted(p.name for p in FIXTURES.glob("*.json")) == sorted(PUBLISHED)
    for name in PUBLISHED:  # the published spellings the loader must keep reading
        raw = fixture(name)
        assert raw["architectures"] in (["DFlashDraftModel"], ["DFlash2DraftModel"]), name
        assert raw["model_type"] == "qwen3" and raw["hidden_act"] == "silu", name
    originals = os.environ.get(ORIGINALS_ENV)
    if originals:
        found = sorted(Path(originals).glob("*.json"))
        assert sorted(p.name for p in found) == sorted(PUBLISHED)
        for p in found:
            assert (FIXTURES / p.name).read_bytes() == p.read_bytes(), p.name


def test_published_spellings_differ_where_upstream_does():
    """The copies keep the spellings that differ between the releases: RoPE theta nested under
    rope_parameters (27B DFlash2) or flat (SpecForge 8B); the DFlash fields in dflash_config (27B)
    or at the top level (8B's block_size), the 8B leaving target_layer_ids and mask_token_id out."""
    d2, d1 = fixture(DFLASH2_FILE), fixture(DFLASH_FILE)
    assert d2["rope_parameters"] == {"rope_theta": 10000000, "rope_type": "default"} and "rope_theta" not in d2
    assert d1["rope_theta"] == 1000000 and "rope_parameters" not in d1 and d1["rope_scaling"] is None
    assert d2["dflash_config"]["target_layer_ids"] == [5, 19, 33, 47, 61]
    assert d2["dflash_config"]["mask_token_id"] == 248070 and d2["dflash_config"]["block_size"] == 8
    assert "dflash_config" not in d1 and d1["block_size"] == 16
    assert "target_layer_ids" not in d1 and "mask_token_id" not in d1 and d1["num_target_layers"] == 36
    assert d2["is_causal"] is False and "is_causal" not in d1


def test_presets_match_the_spec_table():
    a, b = PRESETS["qwen3.5-35b-a3b-dflash"], PRESETS["qwen3.5-27b-dflash2"]
    assert (a.variant, b.variant) == ("dflash", "dflash2")
    assert (a.hidden_size, b.hidden_size) == (2048, 5120)
    assert (a.num_hidden_layers, b.num_hidden_layers) == (6, 5)
    assert (a.intermediate_size, b.intermediate_size) == (6144, 17408)
    for c in (a, b):
        assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (32, 8, 128)
        assert (c.rms_norm_eps, c.rope_theta) == (1e-6, 1e7)
        assert (c.vocab_size, c.mask_token_id) == (248320, 248070)
    assert a.target_layer_ids == (1, 6, 11, 16, 22, 27, 32, 37)
    assert b.target_layer_ids == (5, 19, 33, 47, 61)
    assert a.layer_types == (SLIDING,) * 5 + (FULL,) and a.windows == (4096,) * 5 + (0,)
    assert b.layer_types == (SLIDING,) * 5 and b.windows == (2048,) * 5
    assert a.full_pool and not b.full_pool
    assert (b.conv_kernel_size, b.conv_group_size, b.selector_rank, b.selector_top_k) == (2, 16, 256, 16)
    assert a.conv_kernel_size is None and a.selector_rank is None
    assert b.ring_bytes() == 5 * (2 + 2) * 8 * 128 * 2048 == 40 * MiB
    assert a.ring_bytes() == 5 * 4 * 8 * 128 * 4096 == 80 * MiB


def test_preset_27b_equals_the_published_geometry():
    published = load_config(FIXTURES / DFLASH2_FILE)
    assert PRESETS["qwen3.5-27b-dflash2"] == published


# -- derived quantities and upstream rules ------------------------------------------------------


@pytest.mark.parametrize(
    ("n_target", "n_draft", "ids"),
    [
        (40, 8, [1, 6, 11, 16, 22, 27, 32, 37]),  # the 35B-A3B ids of the spec's table
        (36, 5, [1, 9, 17, 25, 33]),
        (64, 1, [32]),
        (7, 3, [1, 2, 4]),  # 1 + 1.5 = 2.5 rounds half to even, as Python's round upstream
    ],
)
def test_build_target_layer_ids(n_target, n_draft, ids):
    assert build_target_layer_ids(n_target, n_draft) == ids


def test_startup_width_and_overrides():
    raw = fixture(DFLASH2_FILE)
    assert parse_config(raw).K == 7  # block_size 8
    cfg = parse_config(raw, K=15, B=8)
    assert (cfg.K, cfg.W, cfg.B) == (15, 16, 8)
    assert cfg.with_startup(K=1).W == 2
    assert cfg.ring_bytes() == parse_config(raw, K=1).ring_bytes()  # K is round scratch only (C7)
    with pytest.raises(ConfigError, match="K"):
        cfg.with_startup(K=16)


@pytest.mark.parametrize(
    ("use_sw", "max_window_layers", "expected"),
    [
        (True, 2, (FULL, FULL, SLIDING, SLIDING, SLIDING)),
        (True, 0, (SLIDING,) * 5),
        (True, None, (FULL,) * 5),  # Qwen3Config's default max_window_layers is 28
        (False, 0, (FULL,) * 5),  # use_sliding_window false nulls the window
        (None, 0, (FULL,) * 5),
    ],
)
def test_absent_layer_types_resolve_as_qwen3config(use_sw, max_window_layers, expected):
    raw = fixture(DFLASH2_FILE)
    del raw["layer_types"]
    for key, value in (("use_sliding_window", use_sw), ("max_window_layers", max_window_layers)):
        raw.pop(key, None)
        if value is not None:
            raw[key] = value
    cfg = parse_config(raw)
    assert cfg.layer_types == expected
    assert cfg.sliding_window == (2048 if SLIDING in expected else None)


def test_absent_is_causal_flags_the_upstream_causal_layers():
    raw = fixture(DFLASH2_FILE)
    del raw["is_causal"]
    cfg = parse_config(raw)
    assert cfg.is_causal is None
    assert cfg.upstream_causal_layers == (0, 1, 2, 3, 4)
    assert PRESETS["qwen3.5-35b-a3b-dflash"].upstream_causal_layers == ()


def test_logit_transform_fields():
    raw = fixture(DFLASH2_FILE)
    raw["dflash_config"]["output_multiplier"] = 0.5
    raw["final_logit_softcapping"] = 30
    cfg = parse_config(raw)
    assert (cfg.output_multiplier, cfg.final_logit_softcapping) == (0.5, 30.0)
    raw["final_logit_softcapping"] = 0  # upstream: 0 means off
    assert parse_config(raw).final_logit_softcapping is None


def test_reduced_geometry_keeps_the_full_layer_and_validates():
    small = reduced(
        PRESETS["qwen3.5-35b-a3b-dflash"], hidden=64, layers=2, intermediate=96, heads=4, kv_heads=2,
        head_dim=16, window=8, vocab=300,
    )  # fmt: skip
    assert small.layer_types == (SLIDING, FULL) and small.windows == (8, 0)
    assert small.mask_token_id == 299 and small.K == 15
    assert small.ring_bytes() == 1 * 4 * 2 * 16 * 8
    with pytest.raises(ConfigError, match="hidden_size"):
        reduced(PRESETS["qwen3.5-27b-dflash2"], hidden=40)  # not a multiple of the conv group


# -- refusals by name ---------------------------------------------------------------------------


def _set(path: str, value):
    def mutate(raw):
        *parents, leaf = path.split(".")
        node = raw
        for p in parents:
            node = node[p]
        node[leaf] = value

    return mutate


def _delete(path: str):
    def mutate(raw):
        *parents, leaf = path.split(".")
        node = raw
        for p in parents:
            node = node[p]
        del node[leaf]

    return mutate


_D2, _D1 = DFLASH2_FILE, DFLASH_FILE
MALFORMED = [
    # (id, base file, mutation, startup kwargs, the field the message must name)
    ("missing_hidden_size", _D2, _delete("hidden_size"), {}, "hidden_size"),
    ("block_size_str", _D2, _set("dflash_config.block_size", "8"), {}, "dflash_config.block_size"),
    ("K_0", _D2, None, {"K": 0}, "K"),
    ("K_16", _D2, None, {"K": 16}, "K"),
    ("K_bool", _D2, None, {"K": True}, "K"),
    ("B_0", _D2, None, {"B": 0}, "B"),
    ("B_9", _D2, None, {"B": 9}, "B"),
    ("default_K_31", _D1, _set("block_size", 32), {}, "K"),
    ("attention_sink_bias", _D2, _set("attention_sink_bias", True), {}, "attention_sink_bias"),
    ("attention_bias", _D2, _set("attention_bias", True), {}, "attention_bias"),
    ("hidden_act_gelu", _D2, _set("hidden_act", "gelu"), {}, "hidden_act"),
    ("rope_type_yarn", _D2, _set("rope_parameters.rope_type", "yarn"), {}, "rope_parameters.rope_type"),
    ("rope_mrope", _D2, _set("rope_parameters.mrope_section", [11, 11, 10]), {}, "rope_parameters.mrope_section"),
    ("rope_scaling", _D1, _set("rope_scaling", {"rope_type": "linear", "factor": 2.0}), {}, "rope_scaling"),
    ("rope_theta_conflict", _D2, _set("rope_theta", 1e6), {}, "rope_theta"),
    ("rope_theta_missing", _D2, _delete("rope_parameters"), {}, "rope_theta"),
    ("use_qk_norm_false", _D2, _set("use_qk_norm", False), {}, "use_qk_norm"),
    ("block_size_conflict", _D2, _set("block_size", 16), {}, "block_size"),
    ("is_causal_true", _D2, _set("is_causal", True), {}, "is_causal"),
    ("layer_types_length", _D2, _set("layer_types", [SLIDING] * 4), {}, "layer_types"),
    (
        "layer_types_entry",
        _D2,
        _set("layer_types", [SLIDING, SLIDING, "chunked", SLIDING, SLIDING]),
        {},
        "layer_types[2]",
    ),
    ("use_sliding_window_false", _D2, _set("use_sliding_window", False), {}, "use_sliding_window"),
    ("sliding_window_missing", _D2, _delete("sliding_window"), {}, "sliding_window"),
    ("conv_kernel_size_3", _D2, _set("dflash_config.conv_kernel_size", 3), {}, "conv_kernel_size"),
    ("conv_group_size_32", _D2, _set("dflash_config.conv_group_size", 32), {}, "conv_group_size"),
    ("selector_rank_missing", _D2, _delete("dflash_config.selector_rank"), {}, "selector_rank"),
    ("target_id_past_target", _D2, _set("dflash_config.target_layer_ids", [5, 64]), {}, "target_layer_ids[1]"),
    ("target_ids_no_default", _D1, _delete("num_target_layers"), {}, "target_layer_ids"),
    ("mask_past_vocab", _D2, _set("dflash_config.mask_token_id", 248320), {}, "mask_token_id"),
    ("kv_heads_not_dividing", _D2, _set("num_key_value_heads", 5), {}, "num_key_value_heads"),
    ("head_dim_missing", _D2, _delete("head_dim"), {}, "head_dim"),
    ("eps_zero", _D2, _set("rms_norm_eps", 0), {}, "rms_norm_eps"),
    ("hidden_float", _D2, _set("hidden_size", 5120.0), {}, "hidden_size"),
    ("hidden_not_groups", _D2, _set("hidden_size", 5128), {}, "hidden_size"),
    ("architecture", _D2, _set("architectures", ["Qwen3ForCausalLM"]), {}, "architectures"),
    ("model_type", _D2, _set("model_type", "llama"), {}, "model_type"),
    ("embedding_scale", _D2, _set("dflash_config.input_embedding_scale", 2.0), {}, "input_embedding_scale"),
    ("softcap_negative", _D2, _set("final_logit_softcapping", -1.0), {}, "final_logit_softcapping"),
    ("shift_label", _D2, _set("dflash_config.shift_label", True), {}, "dflash_config.shift_label"),
    ("attention_mode_mla", _D2, _set("dflash_config.attention_mode", "mla"), {}, "dflash_config.attention_mode"),
    ("dflash_config_list", _D2, _set("dflash_config", [1]), {}, "dflash_config"),
    (
        "nested_and_flat_ids",
        _D2,
        _set("target_layer_ids", [61, 47, 33, 19, 5]),
        {},
        "target_layer_ids",
    ),
]


@pytest.mark.parametrize(
    ("base", "mutate", "kwargs", "field_name"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_configs_are_refused_by_name(tmp_path, base, mutate, kwargs, field_name):
    raw = copy.deepcopy(fixture(base))
    if mutate is not None:
        mutate(raw)
    path = tmp_path / base
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as info:
        load_config(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{base}: ")
    assert field_name in info.value.field and field_name in message
    # the unmutated file with default startup parses: the mutation is what was refused
    if mutate is not None:
        parse_config(fixture(base))


def test_wrong_type_message_reads_as_documented():
    raw = fixture(DFLASH2_FILE)
    raw["dflash_config"]["block_size"] = "8"
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "SpecForge_x.json")
    assert str(info.value) == "SpecForge_x.json: dflash_config.block_size: expected int, got str"


def test_invalid_json_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"hidden_size": 5120,')
    with pytest.raises(ConfigError, match=r"^broken\.json: <json>: not valid JSON"):
        load_config(path)


# -- properties ---------------------------------------------------------------------------------

_PLACES = st.sampled_from(["nested", "flat", "both"])


def _respell(raw: dict, places: dict[str, str], theta_place: str, theta_as_float: bool) -> dict:
    """Move every present DFlash field to its nested, flat or double spelling (same value)."""
    raw = copy.deepcopy(raw)
    nested = raw.setdefault("dflash_config", {})
    for name in DFLASH_FIELDS:
        value = nested.pop(name, raw.pop(name, None))
        if value is None:
            continue
        place = places[name]
        if place in ("nested", "both"):
            nested[name] = value
        if place in ("flat", "both"):
            raw[name] = copy.deepcopy(value)
    theta = raw.pop("rope_theta", None) or raw.pop("rope_parameters")["rope_theta"]
    theta = float(theta) if theta_as_float else int(theta)
    if theta_place in ("nested", "both"):
        raw["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    if theta_place in ("flat", "both"):
        raw["rope_theta"] = theta
    return raw


@settings(max_examples=60, deadline=None)
@given(
    base=st.sampled_from([DFLASH2_FILE, DFLASH_FILE]),
    places=st.fixed_dictionaries({name: _PLACES for name in DFLASH_FIELDS}),
    theta_place=_PLACES,
    theta_as_float=st.booleans(),
)
def test_nested_and_flat_spellings_give_equal_configs(base, places, theta_place, theta_as_float):
    raw = fixture(base)
    assert parse_config(_respell(raw, places, theta_place, theta_as_float), "respelled") == parse_config(raw)


_CONFLICTS = {
    "block_size": 9,
    "mask_token_id": 7,
    "num_target_layers": 63,
    "conv_kernel_size": 3,
    "conv_group_size": 8,
    "selector_rank": 128,
    "selector_top_k": 8,
    "target_layer_ids": [5, 19, 33, 47],
}


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(sorted(_CONFLICTS)), flat_first=st.booleans())
def test_conflicting_spellings_are_refused_naming_the_field(name, flat_first):
    raw = fixture(DFLASH2_FILE)
    value = raw["dflash_config"].get(name, raw.get(name))
    raw.pop(name, None)
    raw["dflash_config"].pop(name, None)
    raw["dflash_config"][name], raw[name] = (value, _CONFLICTS[name]) if flat_first else (_CONFLICTS[name], value)
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "conflict.json")
    assert info.value.field == name
    assert str(info.value).startswith(f"conflict.json: {name}: dflash_config.{name} = ")


@settings(max_examples=60, deadline=None)
@given(K=st.integers(-3, 20), B=st.integers(-3, 12))
def test_startup_ranges(K, B):
    raw = fixture(DFLASH2_FILE)
    if 1 <= K <= 15 and 1 <= B <= 8:
        cfg = parse_config(raw, K=K, B=B)
        assert (cfg.W, cfg.B) == (K + 1, B)
    else:
        with pytest.raises(ConfigError) as info:
            parse_config(raw, K=K, B=B)
        assert info.value.field == ("K" if not 1 <= K <= 15 else "B")


@settings(max_examples=40, deadline=None)
@given(
    groups=st.integers(1, 8),
    kv_heads=st.integers(1, 4),
    q_per_kv=st.integers(1, 4),
    half_d=st.integers(1, 16),
    types=st.lists(st.sampled_from([SLIDING, FULL]), min_size=1, max_size=6),
    window=st.integers(1, 64),
    variant=st.sampled_from(["qwen3.5-35b-a3b-dflash", "qwen3.5-27b-dflash2"]),
)
def test_reduced_geometries_round_trip_and_size_their_ring(groups, kv_heads, q_per_kv, half_d, types, window, variant):
    cfg = reduced(
        PRESETS[variant], hidden=16 * groups, layers=len(types), layer_types=types, heads=kv_heads * q_per_kv,
        kv_heads=kv_heads, head_dim=2 * half_d, window=window, vocab=512, rank=4, top_k=4,
    )  # fmt: skip
    assert parse_config(cfg.to_dict(), K=cfg.K) == cfg
    local = types.count(SLIDING)
    assert cfg.ring_bytes() == local * 4 * kv_heads * 2 * half_d * window
    assert cfg.full_pool == (FULL in types)
    assert cfg.windows == tuple(window if t == SLIDING else 0 for t in types)



@pytest.mark.parametrize("key", ["partial_rotary_factor", "input_embedding_scale"])
def test_a_boolean_is_not_the_number_one(key):
    # JSON true equals 1 in Python; the only accepted value is the number 1
    raw = fixture("z-lab_Qwen3.8-27B-DFlash2.config.json")
    raw[key] = True
    with pytest.raises(ConfigError, match=key):
        parse_config(raw, "x.json")
    raw[key] = 1
    parse_config(raw, "x.json")
