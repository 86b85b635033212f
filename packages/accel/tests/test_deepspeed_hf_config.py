"""``HfDeepSpeedConfig`` and the ``DeepSpeedPlugin`` members transformers calls (no deepspeed, no
transformers import here).

transformers' ``TrainingArguments`` makes ``DeepSpeedPlugin(hf_ds_config=HfTrainerDeepSpeedConfig)``
(``deepspeed=...``) or, under ``accel launch --use_deepspeed``, ``DeepSpeedPlugin()`` followed by
``set_mixed_precision`` and ``set_deepspeed_weakref``; its ``Trainer`` then replaces
``hf_ds_config`` and assigns ``deepspeed_config`` before filling ``"auto"`` values in place. The
Trainer runs themselves are in ``tests-integration/ecosystem/test_trainer_deepspeed.py``.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel.strategies.deepspeed.config import KnownValues, resolve_config, zero_stage_of
from accel.utils.deepspeed import DeepSpeedPlugin, HfDeepSpeedConfig
from accel_state import PrecisionType

KNOWN = KnownValues(
    micro_batch_size=4, gradient_accumulation_steps=2, mixed_precision="no", world_size=2
)
ZERO3_OFFLOAD = {
    "zero_optimization": {
        "stage": 3,
        "offload_param": {"device": "cpu"},
        "reduce_bucket_size": 1024,
    },
    "gradient_clipping": 0.5,
    "train_micro_batch_size_per_gpu": "auto",
}


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plugins made here see no ``accel launch --use_deepspeed`` settings unless a test sets them."""
    for name in ("ACCEL_USE_DEEPSPEED", "ACCELERATE_USE_DEEPSPEED", "ACCEL_DEEPSPEED_CONFIG"):
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------------- HfDeepSpeedConfig
def test_hf_config_reads_a_dict_a_file_and_base64(tmp_path: Path) -> None:
    source = {"zero_optimization": {"stage": 2}}
    from_dict = HfDeepSpeedConfig(source)
    from_dict.config["zero_optimization"]["stage"] = 3
    assert source["zero_optimization"]["stage"] == 2  # the dict is copied
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ZERO3_OFFLOAD))
    assert HfDeepSpeedConfig(str(path)).config == ZERO3_OFFLOAD
    assert HfDeepSpeedConfig(path).is_zero3()
    encoded = base64.urlsafe_b64encode(json.dumps(source).encode()).decode()
    assert HfDeepSpeedConfig(encoded).is_zero2()


def test_hf_config_queries_by_dotted_key() -> None:
    config = HfDeepSpeedConfig(ZERO3_OFFLOAD)
    assert config.get_value("zero_optimization.offload_param.device") == "cpu"
    assert config.get_value("zero_optimization.missing.key", "dflt") == "dflt"
    node, key = config.find_config_node("zero_optimization.offload_param.device")
    assert node == {"device": "cpu"} and key == "device"
    assert config.find_config_node("optimizer.params.lr") == (None, "lr")
    assert config.is_zero3() and not config.is_zero2() and config.is_offload()
    assert config.is_true("gradient_clipping") and not config.is_false("gradient_clipping")
    assert not HfDeepSpeedConfig({"zero_optimization": {"stage": "auto"}}).is_zero3()
    assert not config.is_true("fp16.enabled") and not config.is_false("fp16.enabled")


def test_hf_config_deletes_subtrees_and_rereads_stage() -> None:
    config = HfDeepSpeedConfig(ZERO3_OFFLOAD)
    config.del_config_sub_tree("zero_optimization.offload_param")
    config.del_config_sub_tree("optimizer.params")  # absent: nothing to do
    with pytest.raises(ValueError, match=r"optimizer\.params"):
        config.del_config_sub_tree("optimizer.params", must_exist=True)
    config.config["zero_optimization"]["stage"] = 2
    assert config.is_zero3()  # read once ...
    config.set_stage_and_offload()  # ... until asked again
    assert config.is_zero2() and not config.is_offload()


def test_hf_config_errors_name_the_input(tmp_path: Path) -> None:
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(AcceleratorConfigError, match="JSON list"):
        HfDeepSpeedConfig(str(listing))
    with pytest.raises(AcceleratorConfigError, match="not a dict, an existing JSON file"):
        HfDeepSpeedConfig("no-such-file.json")
    with pytest.raises(AcceleratorConfigError, match="got int"):
        HfDeepSpeedConfig(3)


# ---------------------------------------------------------------------- the plugin's config
def test_a_plugin_of_fields_holds_accelerates_config() -> None:
    plugin = DeepSpeedPlugin(
        zero_stage=3,
        gradient_clipping=0.5,
        offload_param_device="cpu",
        zero3_save_16bit_model=True,
    )
    assert isinstance(plugin.hf_ds_config, HfDeepSpeedConfig)
    assert plugin.hf_ds_config.config is plugin.deepspeed_config
    assert plugin.deepspeed_config == {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": 0.5,
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu"},
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    }
    assert plugin.hf_ds_config.is_zero3() and plugin.hf_ds_config.is_offload()
    assert plugin.get_value("zero_optimization.stage") == 3 and plugin.is_auto("train_batch_size")
    resolved = resolve_config(plugin, KNOWN)
    assert resolved["train_batch_size"] == 16 and resolved["gradient_accumulation_steps"] == 2
    assert DeepSpeedPlugin().deepspeed_config["zero_optimization"] == {"stage": 2}


def test_fields_left_unset_mirror_a_readable_config(tmp_path: Path) -> None:
    plugin = DeepSpeedPlugin(hf_ds_config=ZERO3_OFFLOAD)
    assert isinstance(plugin.hf_ds_config, HfDeepSpeedConfig)
    assert (plugin.zero_stage, plugin.offload_param_device, plugin.gradient_clipping) == (
        3,
        "cpu",
        0.5,
    )
    # The config stays the source of the mirrored fields: an edit before prepare is no conflict.
    plugin.deepspeed_config["zero_optimization"]["stage"] = 2
    assert zero_stage_of(plugin) == 2
    assert resolve_config(plugin, KNOWN)["zero_optimization"]["stage"] == 2
    # A value the user gives still has to agree with the file.
    with pytest.raises(AcceleratorConfigError, match="gradient_clipping"):
        resolve_config(DeepSpeedPlugin(hf_ds_config=ZERO3_OFFLOAD, gradient_clipping=1.0), KNOWN)
    # "auto" leaves the field unset; a path that cannot be read is kept and reported later.
    for stage in ("auto", "three"):
        assert (
            DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": stage}}).zero_stage is None
        )
    missing = DeepSpeedPlugin(hf_ds_config=str(tmp_path / "later.json"))
    assert missing.hf_ds_config == str(tmp_path / "later.json") and missing.zero_stage is None
    with pytest.raises(AcceleratorConfigError, match="no such file"):
        _ = missing.deepspeed_config


def test_transformers_replaces_the_config_and_fills_it_in_place() -> None:
    """``propagate_args_to_deepspeed``, then ``trainer_config_process``/``_finalize``."""
    plugin = DeepSpeedPlugin()
    plugin.hf_ds_config = HfDeepSpeedConfig(plugin.hf_ds_config.config)
    plugin.deepspeed_config = plugin.hf_ds_config.config
    assert plugin.deepspeed_config is plugin.hf_ds_config.config
    node, key = plugin.hf_ds_config.find_config_node("train_micro_batch_size_per_gpu")
    assert node is not None
    node[key] = 8  # what HfTrainerDeepSpeedConfig.fill_match does
    resolved = resolve_config(plugin, KnownValues(None, 1, "no", 2))
    assert resolved["train_micro_batch_size_per_gpu"] == 8 and resolved["train_batch_size"] == 16
    # Replacing hf_ds_config alone is followed too.
    plugin.hf_ds_config = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 2})
    assert plugin.deepspeed_config == {"train_micro_batch_size_per_gpu": 2}
    with pytest.raises(AcceleratorConfigError, match="assign a dict"):
        plugin.deepspeed_config = "ds.json"  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("precision", "fp16", "bf16"),
    [
        ("no", {"enabled": False}, {"enabled": False}),
        ("fp16", {"enabled": True, "auto_cast": True}, {"enabled": False}),
        (PrecisionType.BF16, {"enabled": False}, {"enabled": True}),
    ],
)
def test_set_mixed_precision_writes_the_half_precision_blocks(
    precision: object, fp16: dict[str, bool], bf16: dict[str, bool]
) -> None:
    plugin = DeepSpeedPlugin(zero_stage=2)
    plugin.set_mixed_precision(precision)
    assert plugin.deepspeed_config["fp16"] == fp16 and plugin.deepspeed_config["bf16"] == bf16
    value = getattr(precision, "value", precision)
    resolved = resolve_config(plugin, KnownValues(4, 1, str(value), 2))
    assert resolved["bf16"]["enabled"] is bf16["enabled"]


def test_set_mixed_precision_fills_auto_and_refuses_conflicts() -> None:
    plugin = DeepSpeedPlugin(hf_ds_config={"bf16": {"enabled": "auto"}})
    plugin.set_mixed_precision("bf16")
    assert plugin.deepspeed_config["bf16"] == {"enabled": True}
    assert plugin.deepspeed_config["fp16"] == {"enabled": False}
    clash = DeepSpeedPlugin(hf_ds_config={"fp16": {"enabled": True}})
    with pytest.raises(AcceleratorConfigError, match=r"enables fp16.*mixed_precision='fp16'"):
        clash.set_mixed_precision("bf16")
    with pytest.raises(UnsupportedFeatureError, match="fp8"):
        DeepSpeedPlugin().set_mixed_precision("fp8")
    with pytest.raises(AcceleratorConfigError, match="choose one of no, fp16, bf16"):
        DeepSpeedPlugin().set_mixed_precision("int4")


def test_set_deepspeed_weakref_keeps_a_config_with_batch_values() -> None:
    plugin = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True)
    plugin.set_deepspeed_weakref()
    kept = plugin.dschf
    assert kept.is_zero3()
    assert kept.config["gradient_accumulation_steps"] == 1
    assert kept.config["train_micro_batch_size_per_gpu"] == 1
    assert "train_batch_size" not in kept.config
    assert plugin.deepspeed_config["train_batch_size"] == "auto"  # the plugin's own is untouched
    # Fields the config leaves open reach the kept copy.
    filed = DeepSpeedPlugin(hf_ds_config={"train_batch_size": 32}, offload_optimizer_device="cpu")
    filed.set_deepspeed_weakref()
    assert filed.dschf.config["train_batch_size"] == 32
    assert filed.dschf.get_value("zero_optimization.offload_optimizer.device") == "cpu"


def test_is_zero3_init_enabled_needs_the_flag_and_stage_3() -> None:
    assert DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True).is_zero3_init_enabled()
    assert not DeepSpeedPlugin(zero_stage=3).is_zero3_init_enabled()
    assert not DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True).is_zero3_init_enabled()
    filed = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}}, zero3_init_flag=True)
    assert filed.is_zero3_init_enabled()


def test_unset_fields_take_the_launchers_deepspeed_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``accel launch --use_deepspeed --zero_stage 3 --zero3_init_flag true`` (Accelerate's env)."""
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv(
        "ACCEL_DEEPSPEED_CONFIG", json.dumps({"zero_stage": 3, "zero3_init_flag": True})
    )
    plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == 3 and plugin.is_zero3_init_enabled()
    assert plugin.hf_ds_config.is_zero3()
    assert DeepSpeedPlugin(zero_stage=1).zero_stage == 1  # what the user sets wins
    filed = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}})
    assert filed.zero_stage == 2 and filed.zero3_init_flag is None  # a config: launcher unused


def test_set_deepspeed_weakref_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("transformers", "transformers.integrations"):
        monkeypatch.setitem(sys.modules, name, None)  # what Python does for a missing module
    plugin = DeepSpeedPlugin(zero_stage=3)
    plugin.set_deepspeed_weakref()
    assert type(plugin.dschf) is HfDeepSpeedConfig and plugin.dschf.is_zero3()
