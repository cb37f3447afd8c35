"""Orbax checkpoints: re-mesh restore, config mismatch naming, half-written dirs, param loading."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest

from t5x_like.models import make_model
from t5x_like.train import checkpoints, train_state
from t5x_like.train.optimizers import create_optimizer
from tests.train.conftest import sharded_plan, tiny_config

SEQ = {"inputs": 16, "targets": 8}


def _setup(mesh_shape, preset, **cfg):
    model = make_model(tiny_config(vocab_size=128, **cfg))
    opt = create_optimizer("adafactor")
    mesh, rules, plan = sharded_plan(model, opt, model.example_batch(4, SEQ, packed=True),
                                     mesh_shape, preset)
    return model, opt, mesh, rules, plan


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A model dir with checkpoints at steps 1 and 2 written on a (1, 4, 2) fsdp+model mesh."""
    model_dir = tmp_path_factory.mktemp("ckpt")
    _, _, mesh, rules, plan = _setup((1, 4, 2), "tensor_parallel_2d")
    state = train_state.create_state(plan, jax.random.key(0), mesh, rules)
    ck = checkpoints.Checkpointer(str(model_dir), save_interval_steps=1, keep=5)
    for step in (1, 2):
        state = state.replace(step=state.step + 1)
        assert ck.save(step, state, {"batches_consumed": step})
    ck.close()
    return model_dir, jax.device_get(state)


def test_restore_onto_a_different_mesh(saved) -> None:
    model_dir, host_state = saved
    _, _, mesh, rules, plan = _setup((8, 1, 1), "data_parallel")
    ck = checkpoints.Checkpointer(str(model_dir), save_interval_steps=1, keep=5)
    assert ck.latest_step() == 2
    state, data = ck.restore(2, plan.abstract)
    assert data == {"batches_consumed": 2}
    emb = state.params["token_embedder"]["embedding"]
    assert emb.sharding == plan.shardings.params["token_embedder"]["embedding"]
    assert emb.sharding.spec == jax.sharding.PartitionSpec(None, None)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), host_state)
    ck.close()


def test_half_written_checkpoint_is_ignored(saved, tmp_path) -> None:
    model_dir, _ = saved
    copy = tmp_path / "m"
    shutil.copytree(model_dir, copy)
    ckdir = copy / checkpoints.CHECKPOINT_SUBDIR
    # What a kill during an async save leaves behind: orbax's temporary step directory.
    shutil.copytree(ckdir / "2", ckdir / "3.orbax-checkpoint-tmp-1234567")
    for root, _, files in os.walk(ckdir / "3.orbax-checkpoint-tmp-1234567"):
        for f in files:
            with open(os.path.join(root, f), "wb") as fh:
                fh.write(b"\0garbage")
    (copy / checkpoints.DATA_STATE_SUBDIR / "3").mkdir(parents=True)
    ck = checkpoints.Checkpointer(str(copy), save_interval_steps=1, keep=5)
    assert ck.latest_step() == 2 and ck.all_steps() == [1, 2]
    _, _, _, _, plan = _setup((1, 1, 1), "data_parallel")
    state, _ = ck.restore(ck.latest_step(), plan.abstract)
    assert int(state.step) == 2
    ck.close()
    assert not (copy / checkpoints.DATA_STATE_SUBDIR / "3").exists()  # stale data state pruned


def test_checkpoint_from_other_config_names_mismatching_params(saved) -> None:
    model_dir, _ = saved
    _, _, _, _, plan = _setup((1, 1, 1), "data_parallel", mlp_dim=96)
    ck = checkpoints.Checkpointer(str(model_dir), save_interval_steps=1, keep=5)
    with pytest.raises(checkpoints.CheckpointMismatchError) as err:
        ck.restore(2, plan.abstract)
    msg = str(err.value)
    assert "encoder/layers_0/mlp/wi_0/kernel" in msg
    assert "(32, 64)" in msg and "(32, 96)" in msg
    ck.close()


def test_load_params_from_our_checkpoint_for_finetuning(saved, tmp_path) -> None:
    model_dir, host_state = saved
    _, _, _, _, plan = _setup((2, 2, 1), "fsdp")
    params = checkpoints.load_params(str(model_dir), plan.abstract.params)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), host_state.params)
    # The same tree from an .npz file of '/'-joined paths (what a converter might write).
    flat = jax.tree_util.tree_flatten_with_path(host_state.params)[0]
    npz = tmp_path / "p.npz"
    np.savez(npz, **{"/".join(k.key for k in path): v for path, v in flat})
    params2 = checkpoints.load_params(str(npz), plan.abstract.params)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(params2), host_state.params)
    _, _, _, _, other = _setup((1, 1, 1), "data_parallel", emb_dim=48)
    expected = r"decoder/decoder_norm/scale: checkpoint shape \(32,\) != model shape \(48,\)"
    with pytest.raises(checkpoints.CheckpointMismatchError, match=expected):
        checkpoints.load_params(str(model_dir), other.abstract.params)


def test_train_state_is_stored_as_the_dict_it_always_was(tmp_path) -> None:
    """A `TrainState` is written byte for byte as the plain dict {'step', 'params', 'opt_state'}
    the trainer saved before the state was typed, and such a dict checkpoint restores as a
    `TrainState` (checkpoints written by earlier versions keep working)."""
    _, _, mesh, rules, plan = _setup((1, 1, 1), "data_parallel")
    state = train_state.create_state(plan, jax.random.key(0), mesh, rules)
    for name, tree in (("typed", state), ("dict", state.as_dict())):
        ck = checkpoints.Checkpointer(str(tmp_path / name), save_interval_steps=1, keep=1,
                                      async_save=False)
        assert ck.save(1, tree, {"batches_consumed": 1})
        ck.close()
    stored = {name: tmp_path / name / checkpoints.CHECKPOINT_SUBDIR / "1" / "state"
              for name in ("typed", "dict")}
    for meta in ("_METADATA", "_sharding"):
        assert (stored["typed"] / meta).read_bytes() == (stored["dict"] / meta).read_bytes()
    ck = checkpoints.Checkpointer(str(tmp_path / "dict"), save_interval_steps=1, keep=1)
    restored, data = ck.restore(1, plan.abstract)
    ck.close()
    assert isinstance(restored, train_state.TrainState) and data == {"batches_consumed": 1}
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(state))
    ck = checkpoints.Checkpointer(str(tmp_path / "typed"), save_interval_steps=1, keep=1)
    as_dict, _ = ck.restore(1, plan.abstract.as_dict())  # a dict target gives a dict
    ck.close()
    assert sorted(as_dict) == ["opt_state", "params", "step"]
