"""Frozen dataclasses that are JAX pytrees, as flax.struct makes them, without importing flax (its linen
modules cost a quarter of a second of every start-up).

    @struct.dataclass
    class Cache:
        keys: jax.Array                                   # a leaf: traced, sharded, donated
        capacity: int = struct.field(pytree_node=False)  # part of the tree's structure: static under jit
"""

from __future__ import annotations

import dataclasses

import jax


def field(pytree_node: bool = True, **kwargs):
    """A dataclass field; pytree_node=False makes it static (hashable, compared when jit looks up a program)."""
    return dataclasses.field(metadata={"pytree_node": pytree_node}, **kwargs)


def dataclass(cls):
    """cls as a frozen dataclass registered as a pytree, with `replace(**changes)` returning a copy."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    fields = dataclasses.fields(cls)
    cls.replace = lambda self, **changes: dataclasses.replace(self, **changes)
    return jax.tree_util.register_dataclass(
        cls, data_fields=[f.name for f in fields if f.metadata.get("pytree_node", True)],
        meta_fields=[f.name for f in fields if not f.metadata.get("pytree_node", True)])
