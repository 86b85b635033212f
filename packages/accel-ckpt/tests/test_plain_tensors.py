"""Writers store only plain dense tensors; everything else is refused by name before writing.

(DTensors across 2 real processes, and ``save_state`` keeping the previous checkpoint, are in
``test_multiprocess.py``.)
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from accel_ckpt import InvalidArgumentError, ProjectConfiguration, save, save_state
from accel_ckpt.memory import require_plain_tensor, tensor_bytes
from accel_ckpt.pickle_io import save_pickled
from accel_ckpt.safetensors_io import read_safetensors, write_safetensors
from accel_ckpt.tree_codec import encode_tree


class QuantizedWeight(torch.nn.Parameter):
    """A ``Parameter`` subclass with data of its own (as bitsandbytes' 8-bit weights are)."""


def _unwritable() -> dict[str, tuple[torch.Tensor, str]]:
    with FakeTensorMode():
        fake = torch.empty(3)
    quantized = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    return {
        "meta": (torch.empty(3, device="meta"), "meta device"),
        "sparse": (torch.eye(3).to_sparse(), "sparse_coo tensor"),
        "fake": (fake, "FakeTensor, a tensor subclass"),
        "quantized": (quantized, "quantized tensor"),
        "nested": (nested, "only dense tensors"),
    }


@pytest.mark.parametrize("kind", ["meta", "sparse", "fake", "quantized", "nested"])
def test_every_writer_refuses_what_is_not_a_plain_dense_tensor(tmp_path, kind):
    tensor, words = _unwritable()[kind]
    with pytest.raises(InvalidArgumentError, match=f"tensor 'block.weight' is .*{words}"):
        write_safetensors(tmp_path / "w.safetensors", {"ok": torch.ones(2), "block.weight": tensor})
    with pytest.raises(InvalidArgumentError, match=rf"w\.pt\.state\.3\.exp_avg is .*{words}"):
        save_pickled({"state": {3: {"exp_avg": tensor, "step": 1}}}, tmp_path / "w.pt")
    with pytest.raises(InvalidArgumentError, match=f"optimizer 0: state.3.exp_avg is .*{words}"):
        encode_tree({"state": {3: {"exp_avg": tensor}}}, "optimizer 0")
    with pytest.raises(InvalidArgumentError, match=words):
        tensor_bytes(tensor)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # refused before creating a file


def test_save_state_refuses_before_publishing_and_pickle_is_no_way_around(tmp_path):
    config = ProjectConfiguration(project_dir=tmp_path, automatic_checkpoint_naming=True)
    model = torch.nn.Linear(2, 2)
    save_state(models=[model], project_config=config)

    class Holder:
        def state_dict(self):
            return {"grid": torch.eye(2).to_sparse()}

        def load_state_dict(self, state):
            pass

    with pytest.raises(
        InvalidArgumentError, match=r"custom object 0: grid is a torch\.sparse_coo tensor"
    ):
        save_state(
            models=[model], custom_objects=[Holder()], project_config=config, allow_pickle=True
        )
    with pytest.raises(InvalidArgumentError, match=r"state_dict\['weight'\] is on the meta device"):
        save_state(models=[torch.nn.Linear(2, 2, device="meta")], project_config=config)
    with pytest.raises(InvalidArgumentError, match="meta device"):
        save({"weights": torch.empty(2, device="meta")}, tmp_path / "weights.pt")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_0"]
    assert not (tmp_path / "weights.pt").exists()


def test_parameters_views_and_parameter_subclasses_with_their_own_data_are_written(tmp_path):
    base = torch.arange(12, dtype=torch.float32)
    tensors = {
        "parameter": torch.nn.Parameter(torch.ones(3)),
        "quantized_weight": QuantizedWeight(torch.full((2,), 7.0)),
        "strided_view": base.view(3, 4)[:, 1],
        "offset_view": base[5:9],
    }
    write_safetensors(tmp_path / "w.safetensors", tensors)
    loaded = read_safetensors(tmp_path / "w.safetensors").tensors
    for name, tensor in tensors.items():
        assert torch.equal(loaded[name], tensor.detach()), name
    assert bytes(tensor_bytes(base[5:9])) == bytes(tensor_bytes(base[5:9].clone()))
    require_plain_tensor(QuantizedWeight(torch.ones(1)), "accepted")


def test_raw_byte_views_are_checked_against_the_tensor_s_own_storage():
    with pytest.raises(InvalidArgumentError, match="contiguous CPU tensor"):
        tensor_bytes(torch.ones(4, 4).t())
    with pytest.raises(InvalidArgumentError, match="a str, not a tensor"):
        require_plain_tensor("weights", "value 'x'")  # type: ignore[arg-type]
