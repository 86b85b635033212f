"""Serve accel under Accelerate's name: ``import accelerate`` gives accel's own modules.

Libraries such as transformers' ``Trainer``, TRL and PEFT import ``accelerate`` by name and check
its installed version through ``importlib.metadata``. :func:`install_as_accelerate` makes both
answer with accel, in this process, from then on (the pattern of PyMySQL's ``install_as_MySQLdb``):

- ``accelerate`` is a small facade module whose attributes are accel's (``accelerate.Accelerator
  is accel.Accelerator``) and whose ``__version__`` is :data:`ACCELERATE_API_VERSION` with a local
  part naming accel's version (``1.15.0+accel.0.1.0``);
- every ``accelerate.<path>`` is the module object ``accel.<path>`` itself, not a copy; replacing
  one of its names (``accelerate.big_modeling.check_device_map = ...``, as transformers does) also
  replaces it in the accel module that uses it (:mod:`accel.patch_forwarding`);
- ``importlib.metadata`` finds a distribution ``accelerate`` of that version ahead of a real
  Accelerate installed beside accel.

A launcher asks for the same in its workers with ``ACCEL_AS_ACCELERATE=1``: accel's start-up
hook (``accel_as_accelerate.pth``) calls :func:`install_from_environment` in every Python process
that has it, restarted and spawned ones included.
"""

from __future__ import annotations

import email.message
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import pathlib
import sys
import types
from collections.abc import Iterable, Sequence
from typing import Any

from accel.__about__ import __version__ as ACCEL_VERSION
from accel.errors import AliasError
from accel.patch_forwarding import forward_patches

#: The Accelerate release whose API accel implements (what ``importlib.metadata`` reports).
ACCELERATE_API_VERSION = "1.15.0"
#: The version ``accelerate`` has under the alias: the API level, accel's version as local part.
ALIAS_VERSION = f"{ACCELERATE_API_VERSION}+accel.{ACCEL_VERSION}"
#: The environment variable that turns the alias on at interpreter start (see the module doc).
AS_ACCELERATE_ENV = "ACCEL_AS_ACCELERATE"
#: Libraries that decide at import time whether (and which) Accelerate is present.
_CONSUMERS = ("transformers", "peft", "trl")
_PREFIX = "accelerate."


def _truthy(raw: str | None) -> bool:
    return (raw or "").strip().lower() in ("1", "true", "yes", "on")


class _FacadeLoader(importlib.abc.Loader):
    """Loader of the ``accelerate`` facade module (built whole; nothing to execute).

    Used when ``accelerate`` is imported while the finder is installed but the facade is not in
    ``sys.modules`` (someone removed it): a new facade, never an empty module.
    """

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _build_facade()

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _AliasLoader(importlib.abc.Loader):
    """Hands out ``accel.<path>`` for ``accelerate.<path>``, keeping the module's own spec."""

    def __init__(self, target: types.ModuleType) -> None:
        self._target = target
        self._spec = target.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._target

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system stamped the alias spec on the module; accel's own name stays its name.
        module.__spec__ = self._spec
        if self._spec is not None:
            module.__loader__ = self._spec.loader
        # A library that swaps ``accelerate.<path>.<name>`` for a while reaches accel's code.
        forward_patches(module)


class _AliasDistribution(importlib.metadata.Distribution):
    """The ``accelerate`` distribution ``importlib.metadata`` reports while the alias is on."""

    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            message = email.message.Message()
            message["Metadata-Version"] = "2.1"
            message["Name"] = "accelerate"
            message["Version"] = ALIAS_VERSION
            message["Summary"] = f"accel {ACCEL_VERSION} serving Accelerate's API"
            return message.as_string()
        if filename == "top_level.txt":
            return "accelerate\n"
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> pathlib.Path:
        return pathlib.Path(__file__).parent / path


class AccelerateAliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``accelerate.*`` modules and the ``accelerate`` distribution in accel."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec handing out ``accel.<path>`` for ``accelerate.<path>``; ``None`` otherwise."""
        if fullname == "accelerate":
            return importlib.machinery.ModuleSpec("accelerate", _FacadeLoader(), is_package=True)
        if not fullname.startswith(_PREFIX):
            return None
        real_name = "accel." + fullname[len(_PREFIX) :]
        try:
            real = importlib.import_module(real_name)
        except ModuleNotFoundError as error:
            if error.name is not None and real_name.startswith(error.name):
                return None  # no such module in accel: the import fails as for Accelerate
            raise
        is_package = hasattr(real, "__path__")
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), is_package=is_package)

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> Iterable[importlib.metadata.Distribution]:
        """The alias distribution when ``accelerate`` (or every distribution) is asked for."""
        name = getattr(context, "name", None)
        if name is None or _normalized(name) == "accelerate":
            return [_AliasDistribution()]
        return []


def _normalized(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()


def _build_facade() -> types.ModuleType:
    """The top-level ``accelerate`` module: accel's names, Accelerate's version."""
    import accel

    facade = types.ModuleType("accelerate", accel.__doc__)
    facade.__version__ = ALIAS_VERSION  # type: ignore[attr-defined]
    facade.__path__ = []  # type: ignore[attr-defined]  # a package: submodules come from the finder
    facade.__file__ = accel.__file__
    facade.__all__ = list(accel.__all__)  # type: ignore[attr-defined]
    facade.__accel_alias__ = True  # type: ignore[attr-defined]

    def __getattr__(name: str) -> Any:
        try:
            return getattr(accel, name)
        except AttributeError:
            pass
        try:
            return importlib.import_module(f"accelerate.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module 'accelerate' (accel) has no attribute {name!r}") from None

    def __dir__() -> list[str]:
        return sorted(set(dir(accel)) | set(vars(facade)))

    facade.__getattr__ = __getattr__  # type: ignore[method-assign]
    facade.__dir__ = __dir__  # type: ignore[method-assign]
    facade.__spec__ = importlib.machinery.ModuleSpec("accelerate", _FacadeLoader(), is_package=True)
    facade.__loader__ = facade.__spec__.loader
    return facade


def is_installed() -> bool:
    """Whether :func:`install_as_accelerate` is in effect in this process."""
    return getattr(sys.modules.get("accelerate"), "__accel_alias__", False) is True


def install_as_accelerate() -> None:
    """Make ``import accelerate`` (and ``importlib.metadata``) give accel, in this process.

    Call it before importing transformers, PEFT or TRL (they check for Accelerate when imported).
    Calling it again does nothing.

    Raises:
        AliasError: A real Accelerate, or a library that already looked for one, was imported first.
    """
    if is_installed():
        return
    loaded = sys.modules.get("accelerate")
    if loaded is not None:
        where = getattr(loaded, "__file__", None) or "an unknown location"
        raise AliasError(
            f"install_as_accelerate() ran after the real accelerate was imported (from {where}); "
            "its modules are in use and cannot be swapped. Call accel.install_as_accelerate() "
            "first thing in the script, or run it with `accel launch --as-accelerate` or "
            "`python -m accel.as_accelerate`."
        )
    early = [name for name in _CONSUMERS if name in sys.modules]
    if early:
        raise AliasError(
            f"install_as_accelerate() ran after {', '.join(early)} was imported, which has already "
            "looked for accelerate (and would keep what it found). Call "
            "accel.install_as_accelerate() before importing it, or run the script with "
            "`accel launch --as-accelerate` or `python -m accel.as_accelerate`."
        )
    sys.meta_path.insert(0, AccelerateAliasFinder())
    sys.modules["accelerate"] = _build_facade()
    importlib.invalidate_caches()


def install_from_environment() -> None:
    """Install the alias when ``ACCEL_AS_ACCELERATE`` is true (called by the start-up hook)."""
    if _truthy(os.environ.get(AS_ACCELERATE_ENV)):
        install_as_accelerate()
