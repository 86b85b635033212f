"""Malicious pickles are refused by default and their payload never runs."""

import json
import pickle
import zlib

import pytest
import torch
from ckpt_helpers import mlp

from accel_ckpt import (
    MANIFEST_NAME,
    UnsafeCheckpointError,
    load,
    load_checkpoint_in_model,
    load_state,
    save_model,
    save_state,
)


class Payload:
    """Unpickling this writes a marker file: stands in for os.system('...')."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_load_refuses_and_the_payload_does_not_run(tmp_path):
    marker = tmp_path / "marker"
    torch.save({"weights": torch.ones(2), "evil": Payload(marker)}, tmp_path / "evil.pt")
    with pytest.raises(
        UnsafeCheckpointError,
        match=r"evil\.pt needs code outside the safe allow-list.*exec.*allow_pickle=True",
    ):
        load(tmp_path / "evil.pt")
    assert not marker.exists()
    (tmp_path / "raw.pkl").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UnsafeCheckpointError, match=r"raw\.pkl"):
        load(tmp_path / "raw.pkl")
    assert not marker.exists()
    assert isinstance(UnsafeCheckpointError("x"), pickle.UnpicklingError)
    # The test payload is real: the explicit opt-in runs it.
    load(tmp_path / "evil.pt", allow_pickle=True)
    assert marker.read_text() == "pwned"


def test_model_bin_with_payload_is_refused(tmp_path):
    marker = tmp_path / "marker"
    net = mlp()
    save_model(net, tmp_path, safe_serialization=False, is_main_process=True)
    state = dict(net.state_dict())
    torch.save({**state, "__evil__": Payload(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match=r"pytorch_model\.bin"):
        load_checkpoint_in_model(mlp(), tmp_path)
    assert not marker.exists()


def test_checkpoint_with_planted_pickle_is_refused(tmp_path):
    """A complete-looking checkpoint whose custom object file is a malicious pickle."""
    marker = tmp_path / "marker"

    class Holder:
        def __init__(self):
            self.state = {"x": 1}

        def state_dict(self):
            return self.state

        def load_state_dict(self, state):
            self.state = state

    path = save_state(tmp_path / "ckpt", custom_objects=[Holder()])
    (path / "custom_checkpoint_0.safetensors").unlink()
    torch.save(Payload(marker), path / "custom_checkpoint_0.pkl")
    data = (path / "custom_checkpoint_0.pkl").read_bytes()
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    del manifest["files"]["custom_checkpoint_0.safetensors"]
    manifest["files"]["custom_checkpoint_0.pkl"] = {
        "size": len(data),
        "crc32": f"{zlib.crc32(data):08x}",
    }
    manifest["contents"]["custom_objects"] = ["custom_checkpoint_0.pkl"]
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(UnsafeCheckpointError, match=r"custom_checkpoint_0\.pkl"):
        load_state(path, custom_objects=[Holder()])
    assert not marker.exists()
