"""Name -> function registry so configs can select a loss or advantage estimator by string.

    @register("policy_loss", "grpo_roc")
    def policy_loss(...): ...
    fn = get("policy_loss", "grpo_roc")
"""
from __future__ import annotations

from typing import Callable

_REGISTRY: dict[str, dict[str, Callable]] = {}


def register(kind: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn`` under (kind, name); a duplicate name is an error."""
    def deco(fn: Callable) -> Callable:
        table = _REGISTRY.setdefault(kind, {})
        if name in table and table[name] is not fn:
            raise ValueError(f"registry: {kind}/{name!r} is already registered to {table[name]!r}")
        table[name] = fn
        return fn
    return deco


def get(kind: str, name: str) -> Callable:
    """The function registered under (kind, name); KeyError lists the known names."""
    table = _REGISTRY.get(kind, {})
    if name not in table:
        raise KeyError(f"registry: no {kind} named {name!r}; known: {sorted(table)}")
    return table[name]


def names(kind: str) -> list[str]:
    return sorted(_REGISTRY.get(kind, {}))
