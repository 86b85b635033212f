"""``HfDeepSpeedConfig``: a DeepSpeed config read once and queried by dotted key.

transformers subclasses it (``HfTrainerDeepSpeedConfig`` fills the ``"auto"`` entries from the
``TrainingArguments``) and keeps it alive so that ``from_pretrained`` knows a ZeRO-3 run is on.
``DeepSpeedPlugin(hf_ds_config=...)`` accepts it and reads its live ``config`` dict.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import os
from collections.abc import Mapping
from typing import Any

from accel.errors import AcceleratorConfigError

_OFFLOAD_DEVICES = frozenset({"cpu", "nvme"})


def _read_config(source: Any) -> dict[str, Any]:
    """A dict (deep-copied), a JSON file path, or base64 text of a JSON object, as a dict.

    Raises:
        AcceleratorConfigError: The source is none of those, or does not hold a JSON object.
    """
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    if isinstance(source, (str, os.PathLike)) and os.path.exists(source):
        with open(source, encoding="utf-8") as handle:
            data = json.load(handle)
    elif isinstance(source, str):
        try:
            data = json.loads(base64.urlsafe_b64decode(source).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise AcceleratorConfigError(
                f"HfDeepSpeedConfig({source!r}): not a dict, an existing JSON file or base64 "
                "text of a JSON object; pass one of those."
            ) from None
    else:
        raise AcceleratorConfigError(
            f"HfDeepSpeedConfig expects a dict, a JSON file path or base64 text, got "
            f"{type(source).__name__}."
        )
    if not isinstance(data, dict):
        raise AcceleratorConfigError(
            f"HfDeepSpeedConfig: the config holds a JSON {type(data).__name__}; a DeepSpeed "
            "config is an object."
        )
    return data


class HfDeepSpeedConfig:
    """A DeepSpeed config with dotted-key queries (``get_value("zero_optimization.stage")``).

    Args:
        config_file_or_dict: A dict (copied), the path of a JSON file, or base64 text of one.

    Raises:
        AcceleratorConfigError: The config cannot be read as a JSON object.
    """

    def __init__(self, config_file_or_dict: Any) -> None:
        self.config: dict[str, Any] = _read_config(config_file_or_dict)
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Read the ZeRO stage and whether anything is offloaded (after ``config`` changes)."""
        stage = self.get_value("zero_optimization.stage", -1)
        # "auto" (or anything not a number) is no stage yet, as in Accelerate.
        self._stage = int(stage) if str(stage).strip().lstrip("-").isdigit() else -1
        self._offload = False
        if self.is_zero2() or self.is_zero3():
            devices = {
                self.get_value("zero_optimization.offload_optimizer.device"),
                self.get_value("zero_optimization.offload_param.device"),
            }
            self._offload = bool(devices & _OFFLOAD_DEVICES)

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """The dict holding the last part of ``ds_key_long`` and that part (``None`` if absent)."""
        node: Any = self.config
        *parents, key = ds_key_long.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, key
        return (node if isinstance(node, dict) else None), key

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value under the dotted key, or ``default`` when it is absent."""
        node, key = self.find_config_node(ds_key_long)
        if node is None:
            return default
        return node.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove the entry under the dotted key.

        Raises:
            ValueError: ``must_exist`` and the key is absent.
        """
        node: Any = self.config
        parts = ds_key_long.split(".")
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                if must_exist:
                    raise ValueError(f"Can't find {ds_key_long} entry in the config: {self.config}")
                return
        if isinstance(node, dict):
            node.pop(parts[-1], None)

    def is_true(self, ds_key_long: str) -> bool:
        """Whether the entry exists and is true (absent is neither true nor false)."""
        value = self.get_value(ds_key_long)
        return value is not None and bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """Whether the entry exists and is false."""
        value = self.get_value(ds_key_long)
        return value is not None and not bool(value)

    def is_zero2(self) -> bool:
        """ZeRO stage 2."""
        return self._stage == 2

    def is_zero3(self) -> bool:
        """ZeRO stage 3."""
        return self._stage == 3

    def is_offload(self) -> bool:
        """ZeRO 2/3 with optimizer or parameter offload to the CPU or NVMe."""
        return self._offload
