"""fp8 backends that cannot run here are refused up front, with the reason and the fix.

TransformerEngine and MS-AMP need CUDA GPUs with compute capability 8.9+ and their packages
(neither is installed in the test venvs, as on most machines); torchao needs its package. None
falls back to bf16 silently. Also: recipe validation and the launcher's fp8 settings.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from accel import Accelerator, AcceleratorConfigError, UnsupportedFeatureError
from accel.fp8 import (
    AORecipeKwargs,
    FP8BackendType,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
    check_cuda_fp8_capability,
    make_fp8_precision,
)
from accel.fp8.ao import TORCHAO_MIN_TORCH
from accel.fp8.msamp import MSAMPPrecision
from accel.fp8.setup import FP8Setup
from accel.fp8.transformer_engine import TEPrecision
from accel.utils.imports import is_torch_version
from accel_state import DistributedType
from accel_state import contract as names
from accel_state.errors import TorchFeatureError

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("recipe", [TERecipeKwargs(), FP8RecipeKwargs(backend="te")])
def test_transformer_engine_on_the_cpu_is_refused_pointing_at_torchao(recipe):
    with pytest.raises(UnsupportedFeatureError) as caught:
        Accelerator(mixed_precision="fp8", kwargs_handlers=[recipe])
    message = str(caught.value)
    assert "TransformerEngine" in message and "CUDA GPU" in message
    assert "--fp8_backend ao" in message and "bf16" in message


def test_transformer_engine_missing_names_the_install_command():
    with pytest.raises(UnsupportedFeatureError, match=r"pip install transformer-engine\[pytorch\]"):
        TEPrecision(CUDA, TERecipeKwargs().resolved({}))


def test_msamp_is_refused_on_the_cpu_without_its_package_and_under_fsdp():
    with pytest.raises(UnsupportedFeatureError, match="MS-AMP needs a CUDA GPU"):
        Accelerator(mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs(opt_level="O1")])
    with pytest.raises(UnsupportedFeatureError, match="Azure/MS-AMP"):
        MSAMPPrecision(CUDA, MSAMPRecipeKwargs().resolved({}), DistributedType.MULTI_GPU)
    with pytest.raises(UnsupportedFeatureError, match="does not work with FSDP"):
        MSAMPPrecision(CUDA, MSAMPRecipeKwargs().resolved({}), DistributedType.FSDP)


def test_missing_torchao_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # what Python does for a missing module
    with pytest.raises(UnsupportedFeatureError, match=r"pip install 'accel\[fp8\]'"):
        Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    # With no fp8 engine at all, the automatic choice says what to install.
    with pytest.raises(UnsupportedFeatureError, match=r"none is installed.*accel\[fp8\]"):
        Accelerator(mixed_precision="fp8")


def test_torchao_on_a_torch_older_than_it_supports_names_both_versions(monkeypatch):
    """torchao 0.18 fails inside its own import on torch < 2.11 (an AttributeError): refused
    first, naming the torch it needs, the torch found and the way out. On a torch that torchao
    supports, an older one is pretended; on an older one (nox -s torch_versions) it is real."""
    if importlib.util.find_spec("torchao") is None:  # not imported: it fails on an older torch
        pytest.skip("needs torchao installed (accel[test] installs it)")
    if is_torch_version(">=", TORCHAO_MIN_TORCH):
        monkeypatch.setattr(torch, "__version__", "2.6.0")
    with pytest.raises(UnsupportedFeatureError) as caught:
        Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    message = str(caught.value)
    assert f"torch {TORCHAO_MIN_TORCH} or newer" in message
    assert f"this is torch {torch.__version__.split('+')[0]}" in message
    assert isinstance(caught.value, TorchFeatureError)
    assert "bf16" in message


def test_deepspeed_and_xla_with_fp8_are_refused():
    setup = FP8Setup(FP8BackendType.AO, AORecipeKwargs().resolved({}))
    for kind in (DistributedType.DEEPSPEED, DistributedType.XLA):
        with pytest.raises(UnsupportedFeatureError, match=f"not supported with {kind.value}"):
            make_fp8_precision(setup, torch.device("cpu"), kind, fsdp2=False)
    with pytest.raises(UnsupportedFeatureError, match="needs FSDP2"):
        make_fp8_precision(setup, torch.device("cpu"), DistributedType.FSDP, fsdp2=False)


def test_cuda_fp8_capability_is_false_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the answer depends on its compute capability")
    assert check_cuda_fp8_capability() is False


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: TERecipeKwargs(fp8_format="E3M4"), ["fp8_format='E3M4'", "HYBRID"]),
        (lambda: TERecipeKwargs(amax_compute_algo="mean"), ["amax_compute_algo", "most_recent"]),
        (lambda: TERecipeKwargs(margin=-1), ["margin=-1", ">= 0"]),
        (lambda: TERecipeKwargs(override_linear_precision=(True,)), ["three booleans"]),
        (lambda: MSAMPRecipeKwargs(opt_level="O3"), ["opt_level='O3'", "O1"]),
        (lambda: FP8RecipeKwargs(backend="cuda"), ["backend='cuda'", "AO"]),
    ],
)
def test_bad_recipe_values_name_the_field(build, words):
    with pytest.raises(AcceleratorConfigError) as caught:
        build()
    for word in words:
        assert word in str(caught.value)


def test_two_fp8_recipes_are_refused():
    with pytest.raises(AcceleratorConfigError, match="2 fp8 recipes"):
        Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(), MSAMPRecipeKwargs()])


def test_the_launchers_fp8_settings_choose_the_backend_and_fill_the_recipe(monkeypatch):
    monkeypatch.setenv(names.MIXED_PRECISION, "fp8")
    monkeypatch.setenv(names.FP8_BACKEND, "AO")
    monkeypatch.setenv(names.FP8_CONFIG, json.dumps({"pad_inner_dim": False}))
    accelerator = Accelerator()
    assert accelerator.mixed_precision == "fp8" and accelerator.fp8_enabled
    assert accelerator.fp8_backend is FP8BackendType.AO and accelerator.has_fp8_handler
    recipe = accelerator.ao_recipe_handler
    assert recipe is not None and recipe.pad_inner_dim is False
    assert accelerator.te_recipe_handler is None and accelerator.fp8_recipe_handler is None
    # An explicit recipe field wins over the launcher's.
    from accel_state import reset_state

    reset_state()
    explicit = Accelerator(kwargs_handlers=[AORecipeKwargs(pad_inner_dim=True)])
    assert explicit.ao_recipe_handler.pad_inner_dim is True


def test_launcher_te_backend_is_refused_here(monkeypatch):
    monkeypatch.setenv(names.MIXED_PRECISION, "fp8")
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")
    with pytest.raises(UnsupportedFeatureError, match="TransformerEngine"):
        Accelerator()


def test_fp8_recipe_kwargs_for_torchao_converts_like_ao_recipe_kwargs():
    accelerator = Accelerator(
        mixed_precision="fp8", kwargs_handlers=[FP8RecipeKwargs(backend="ao")]
    )
    assert accelerator.fp8_backend is FP8BackendType.AO
    assert accelerator.fp8_recipe_handler is not None and accelerator.ao_recipe_handler is not None
    model = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(3)))
    model = accelerator.prepare(model)
    assert [type(layer).__name__ for layer in model] == ["Linear", "Float8Linear", "Linear"]
