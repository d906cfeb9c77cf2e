"""Drafters by name: the built-in ones (drafters/__init__) and any registered from outside the package.

    from jspec.decode import drafters
    drafters.register("mine", MyProposer())        # a Proposer (drafters.base)
    engine = dataclasses.replace(engine, drafter=Drafter(mode="mine"))

A name `ngram+X` needs no registration: it is the n-gram combinator over X (drafters.combined), unless a
drafter was registered under that very name (the built-in ngram+model and ngram+self are, for their priors).
"""

from __future__ import annotations

from jspec.config import DraftSpec
from jspec.decode.drafters.base import Proposer
from jspec.decode.drafters.combined import Combined

_REGISTRY: dict[str, Proposer] = {}
_BUILT_IN: set[str] = set()  # names register refuses


def register(name: str, proposer: Proposer) -> None:
    """Makes `proposer` the drafter of Drafter(mode=name); a name taken by a built-in drafter is refused."""
    if not isinstance(proposer, Proposer):
        raise TypeError(f"a drafter is a drafters.Proposer, got {type(proposer).__name__}")
    if name in _BUILT_IN:
        raise ValueError(f"{name!r} is a built-in drafter")
    _REGISTRY[str(name)] = proposer


def proposer(name: str) -> Proposer:
    """The drafter registered under name, or the n-gram combinator over a registered one (ngram+X)."""
    name = str(name)
    if name in _REGISTRY:
        return _REGISTRY[name]
    parsed = DraftSpec.parse(name)
    if parsed.copies and str(parsed.model) in _REGISTRY:
        inner = _REGISTRY[str(parsed.model)]
        return Combined(inner=inner, prior_alpha=inner.prior_alpha)
    raise KeyError(f"no drafter named {name!r}; registered: {', '.join(sorted(_REGISTRY))}")


def names() -> list[str]:
    return sorted(_REGISTRY)


def of(m) -> Proposer:
    """The drafter of a program's Models."""
    return proposer(m.drafter.mode)


def built_in(name: str, p: Proposer) -> None:
    """A drafter of this package under its name (drafters/__init__), which register then refuses."""
    _REGISTRY[name] = p
    _BUILT_IN.add(name)
