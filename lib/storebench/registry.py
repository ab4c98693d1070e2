"""What every registry of members shares (formats, studies): name -> member, each member's
module imported on first use, so that listing the names imports nothing."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib import import_module


class LazyRegistry(Mapping):
    """``modules`` maps each name to the importable module that defines the member;
    ``member(module, name)`` turns the imported module into what the registry hands out."""

    kind = "member"

    def __init__(self, modules: Mapping[str, str]) -> None:
        self._modules = dict(modules)

    def member(self, module, name: str):
        return module

    def __getitem__(self, name: str):
        if name not in self._modules:
            raise KeyError(name)
        return self.member(import_module(self._modules[name]), name)

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)

    def register(self, name: str, module: str) -> None:
        """Add ``name``, defined by the importable ``module`` (one of your own, or a
        plugin's); it comes after the others."""
        if name in self._modules:
            raise ValueError(f"{self.kind} {name!r} is registered already")
        self._modules[name] = module
