"""Checkpoint loading in the published layout (issue 11 item 1): tiny random checkpoints of both
geometries load back (single file and sharded), and every malformed one is refused in one line
naming the tensor (or file) at fault."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conformance import checkpoint as ck
from reference import state_dict as sdm
from reference.numerics import storage


@pytest.fixture(params=["dflash", "dflash2"])
def variant(request):
    return request.param


def _good(variant, seed=0):
    cfg = ck.tiny_config(variant)
    return cfg, sdm.random_state_dict(cfg, np.random.default_rng(seed))


@pytest.mark.parametrize("shards", [1, 3])
def test_round_trip(tmp_path, variant, shards):
    cfg, sd = _good(variant)
    ck.write(tmp_path, cfg, sd, shards=shards)
    got = ck.load(tmp_path, K=cfg.K)
    assert got.cfg == cfg and set(got.state_dict) == set(sd)
    for k in sd:
        assert got.state_dict[k].dtype == ck.BF16 and np.array_equal(got.state_dict[k].view(np.uint16),
                                                                        np.asarray(sd[k]).view(np.uint16))
    assert (tmp_path / ("model.safetensors" if shards == 1 else "model.safetensors.index.json")).is_file()


def test_random_checkpoint_geometries(tmp_path):
    a = ck.random_checkpoint(tmp_path / "a", "dflash", 1)
    b = ck.random_checkpoint(tmp_path / "b", "dflash2", 2, shards=2)
    assert a.cfg.windows[-1] == 0 and a.cfg.windows[0] > 0  # local layers, then one full layer
    assert all(b.cfg.windows) and b.cfg.selector_rank and sdm.PREDECESSOR in b.state_dict


def _refused(tmp_path, cfg, sd, **kw) -> str:
    ck.write(tmp_path, cfg, sd, check_first=False, **kw)
    with pytest.raises(ck.CheckpointError) as info:
        ck.load(tmp_path, K=cfg.K)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_missing_tensor(tmp_path, variant):
    cfg, sd = _good(variant)
    del sd["layers.1.mlp.up_proj.weight"]
    msg = _refused(tmp_path, cfg, sd)
    assert "layers.1.mlp.up_proj.weight: missing" in msg


def test_misshaped_tensor_names_the_config_field(tmp_path, variant):
    cfg, sd = _good(variant)
    sd["layers.0.self_attn.k_proj.weight"] = storage(np.zeros((8, cfg.hidden_size)), "bf16")
    msg = _refused(tmp_path, cfg, sd)
    assert "layers.0.self_attn.k_proj.weight: has shape [8, 32], expected [16, 32]" in msg
    assert "num_key_value_heads=2" in msg


def test_wrong_dtype(tmp_path, variant):
    cfg, sd = _good(variant)
    sd["norm.weight"] = np.asarray(sd["norm.weight"], np.float32)
    assert "norm.weight: has dtype F32, expected BF16" in _refused(tmp_path, cfg, sd)


def test_unknown_extra_tensor(tmp_path, variant):
    cfg, sd = _good(variant)
    sd["lm_head.weight"] = storage(np.zeros((4, 4)), "bf16")
    assert "lm_head.weight: unknown tensor" in _refused(tmp_path, cfg, sd)


def test_config_and_tensors_disagree_on_layers(tmp_path, variant):
    cfg, sd = _good(variant)
    raw = cfg.to_dict()
    raw["num_hidden_layers"] = 1
    raw["layer_types"] = raw["layer_types"][:1]
    msg = _refused(tmp_path, cfg, sd, config=raw)
    assert "layers.1." in msg and "num_hidden_layers=1" in msg


def test_config_and_tensors_disagree_on_feature_width(tmp_path, variant):
    cfg, sd = _good(variant)
    raw = cfg.to_dict()
    raw["dflash_config"]["target_layer_ids"] = [0, 1, 3]
    msg = _refused(tmp_path, cfg, sd, config=raw)
    assert "fc.weight: has shape [32, 64], expected [32, 96]" in msg and "len(target_layer_ids)=3" in msg


def test_dflash2_tensor_in_a_dflash_checkpoint(tmp_path):
    cfg, sd = _good("dflash")
    _, sd2 = _good("dflash2")
    sd[sdm.HIDDEN_PROJECTION] = sd2[sdm.HIDDEN_PROJECTION]
    assert "a DFlash2 tensor" in _refused(tmp_path, cfg, sd)


def test_shard_missing_and_index_mismatch(tmp_path, variant):
    cfg, sd = _good(variant)
    ck.write(tmp_path / "a", cfg, sd, shards=2)
    (tmp_path / "a" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ck.CheckpointError, match="its shard model-00002-of-00002.safetensors .* is missing"):
        ck.load(tmp_path / "a", K=cfg.K)
    ck.write(tmp_path / "b", cfg, sd, shards=2)
    index = json.loads((tmp_path / "b" / ck.INDEX).read_text())
    name = sorted(index["weight_map"])[0]
    del index["weight_map"][name]
    (tmp_path / "b" / ck.INDEX).write_text(json.dumps(index))
    with pytest.raises(ck.CheckpointError, match=f"{name}: stored in .* but not listed"):
        ck.load(tmp_path / "b", K=cfg.K)


def test_bad_config_is_one_line(tmp_path, variant):
    cfg, sd = _good(variant)
    raw = cfg.to_dict()
    raw["attention_bias"] = True
    msg = _refused(tmp_path, cfg, sd, config=raw)
    assert "config.json attention_bias" in msg


def test_round_kwargs_round_trip(tmp_path, variant):
    cfg, sd = _good(variant)
    inputs, config = ck.round_inputs(cfg, sd)
    got_cfg, got_sd = ck.from_round_kwargs({**inputs, "config": config}, K=cfg.K)
    assert got_cfg == cfg and set(got_sd) == set(sd)
    ck.write_round_checkpoint({**inputs, "config": config}, tmp_path)
    assert ck.load(tmp_path, K=cfg.K).cfg == cfg
