"""GPU paths: device maps onto CUDA, pinned staging for asynchronous saves, CUDA RNG states."""

import pytest
import torch
from ckpt_helpers import TiedLM, same, snapshot

from accel_ckpt import load_checkpoint_in_model, load_state, save_model, save_state

pytestmark = pytest.mark.cuda


def test_device_map_onto_cuda(tmp_path):
    torch.manual_seed(0)
    source = TiedLM()
    save_model(source, tmp_path, max_shard_size="2KB", is_main_process=True)
    with torch.device("meta"):
        target = TiedLM()
    load_checkpoint_in_model(target, tmp_path, device_map={"": "cpu", "body": 0}, strict=True)
    assert target.body[0].weight.device.type == "cuda"
    assert target.embed.weight.device.type == "cpu"
    assert target.head.weight is target.embed.weight
    assert same(target.state_dict(), source.state_dict())


def test_async_save_of_cuda_state_and_rng(tmp_path):
    torch.manual_seed(1)
    model = TiedLM().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randint(0, 50, (2, 3), device="cuda")).sum().backward()
    optimizer.step()
    expected = snapshot({"models": [model], "optimizers": [optimizer]})
    torch.cuda.manual_seed(5)
    handle = save_state(tmp_path / "ckpt", models=[model], optimizers=[optimizer], blocking=False)
    with torch.no_grad():
        model.embed.weight.add_(1)  # after the snapshot: must not reach the file
    handle.wait()
    draw = torch.rand(3, device="cuda")
    load_state(tmp_path / "ckpt", models=[model], optimizers=[optimizer])
    assert torch.equal(torch.rand(3, device="cuda"), draw)
    assert same(snapshot({"models": [model], "optimizers": [optimizer]}), expected)
    assert model.embed.weight.device.type == "cuda"
