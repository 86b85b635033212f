"""Split nested Python state (``state_dict()`` results) into JSON plus a flat dict of tensors.

Supported without pickle: ``None``, ``bool``, ``int``, ``float`` (also ``nan``/``inf``), ``str``,
``bytes``, ``list``, ``tuple``, ``dict`` / ``OrderedDict`` (any supported keys), tensors,
``torch.dtype``, ``torch.device``, ``torch.Size`` and, when numpy is installed, numpy arrays and
scalars of numeric dtypes. Everything else raises :class:`UnsupportedValueError`; a tensor
that is not a plain dense tensor (``DTensor``, meta, sparse...) raises ``InvalidArgumentError``.

JSON encoding: plain values and lists as themselves; dicts with string keys not starting with
``$`` as objects; everything else as a one-key tagged object (``{"$tuple": [...]}``,
``{"$dict": [[key, value], ...]}``, ``{"$tensor": "name"}``...). The same tensor object reached
twice is stored once and comes back as one object.
"""

from __future__ import annotations

import base64
import collections
from collections.abc import Mapping
from typing import Any

import torch

from accel_ckpt.errors import CorruptCheckpointError, UnsupportedValueError
from accel_ckpt.memory import require_plain_tensor

_PLAIN = (type(None), bool, int, float, str)


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


class _Encoder:
    def __init__(self, what: str) -> None:
        self.what = what
        self.tensors: dict[str, torch.Tensor] = {}
        self.names: dict[int, str] = {}

    def tensor(self, value: torch.Tensor, path: str) -> str:
        known = self.names.get(id(value))
        if known is not None:
            return known
        require_plain_tensor(value, f"{self.what}: {path or 'the value'}")
        name = path or "tensor"
        while name in self.tensors:
            name += "'"
        self.tensors[name] = value
        self.names[id(value)] = name
        return name

    def encode(self, value: Any, path: str) -> Any:
        if isinstance(value, _PLAIN) and type(value) in _PLAIN:
            return value
        if isinstance(value, torch.Tensor):
            return {"$tensor": self.tensor(value, path)}
        if isinstance(value, torch.Size):
            return {"$size": list(value)}
        if isinstance(value, list) and type(value) is list:
            return [self.encode(item, _join(path, i)) for i, item in enumerate(value)]
        if type(value) is tuple:
            return {"$tuple": [self.encode(item, _join(path, i)) for i, item in enumerate(value)]}
        if type(value) in (dict, collections.OrderedDict):
            return self.mapping(value, path)
        if isinstance(value, torch.dtype):
            return {"$dtype": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"$device": str(value)}
        if isinstance(value, bytes):
            return {"$bytes": base64.b64encode(value).decode()}
        if type(value).__module__ == "numpy":
            return self.numpy(value, path)
        raise UnsupportedValueError(
            f"{self.what}: {path or 'the state'} is a {type(value).__name__} "
            f"({value!r:.80}), which cannot be stored without pickle. Return tensors, numbers, "
            "strings, lists, tuples or dicts from state_dict(), or save with allow_pickle=True "
            "(and load it with allow_pickle=True, trusting the file)."
        )

    def mapping(self, value: Mapping[Any, Any], path: str) -> Any:
        ordered = type(value) is collections.OrderedDict
        if not ordered and all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: self.encode(v, _join(path, k)) for k, v in value.items()}
        items = [[self.encode(k, path), self.encode(v, _join(path, k))] for k, v in value.items()]
        return {"$odict" if ordered else "$dict": items}

    def numpy(self, value: Any, path: str) -> Any:
        import numpy as np

        if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
            array = np.ascontiguousarray(value)
            raw = torch.from_numpy(array.reshape(-1).view(np.uint8).copy())
            return {
                "$ndarray": self.tensor(raw, path),
                "dtype": array.dtype.str,
                "shape": list(array.shape),
            }
        if isinstance(value, np.generic) and value.dtype.kind in "biufc":
            return {"$npscalar": value.dtype.str, "value": self.encode(value.item(), path)}
        raise UnsupportedValueError(
            f"{self.what}: {path} is a numpy {type(value).__name__} of dtype "
            f"{getattr(value, 'dtype', '?')}; only numeric numpy data is stored without pickle."
        )


def encode_tree(value: Any, what: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split ``value`` into a JSON-serialisable tree and the tensors it references.

    Args:
        value: Usually the result of a ``state_dict()``.
        what: Names the object in error messages (e.g. ``"optimizer 0"``).

    Raises:
        UnsupportedValueError: ``value`` holds an object that needs pickle.

    """
    encoder = _Encoder(what)
    tree = encoder.encode(value, "")
    return tree, encoder.tensors


def decode_tree(tree: Any, tensors: Mapping[str, torch.Tensor], where: str) -> Any:
    """Rebuild the value :func:`encode_tree` split; ``where`` names the file in errors."""
    cache: dict[str, torch.Tensor] = {}

    def tensor(name: str) -> torch.Tensor:
        if name not in tensors:
            raise CorruptCheckpointError(f"{where}: tensor {name!r} is referenced but not stored.")
        return cache.setdefault(name, tensors[name])

    def decode(node: Any) -> Any:
        if isinstance(node, list):
            return [decode(item) for item in node]
        if not isinstance(node, dict):
            return node
        if len(node) >= 1 and all(isinstance(k, str) for k in node):
            tag = next(iter(node), "")
            if tag.startswith("$"):
                return tagged(tag, node)
        return {k: decode(v) for k, v in node.items()}

    def tagged(tag: str, node: dict[str, Any]) -> Any:
        body = node[tag]
        if tag == "$tensor":
            return tensor(body)
        if tag == "$tuple":
            return tuple(decode(item) for item in body)
        if tag == "$dict":
            return {decode(k): decode(v) for k, v in body}
        if tag == "$odict":
            return collections.OrderedDict((decode(k), decode(v)) for k, v in body)
        if tag == "$size":
            return torch.Size(body)
        if tag == "$dtype":
            dtype = getattr(torch, body, None)
            if not isinstance(dtype, torch.dtype):
                raise CorruptCheckpointError(f"{where}: {body!r} is not a torch dtype.")
            return dtype
        if tag == "$device":
            return torch.device(body)
        if tag == "$bytes":
            return base64.b64decode(body)
        if tag == "$ndarray":
            import numpy as np

            raw = tensor(body).numpy().tobytes()
            return np.frombuffer(raw, dtype=np.dtype(node["dtype"])).reshape(node["shape"]).copy()
        if tag == "$npscalar":
            import numpy as np

            return np.dtype(body).type(decode(node["value"]))
        raise CorruptCheckpointError(f"{where}: unknown tag {tag!r} in the stored structure.")

    return decode(tree)
