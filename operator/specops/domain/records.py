"""`replace` for the control loop's frozen records, at a fraction of `dataclasses.replace`'s cost.

A tick replaces a few dozen records (the policy's state, the learning state, the probe ledger):
`dataclasses.replace` walks the class's fields, calls `__init__` with every field as a keyword,
and a frozen `__init__` sets each one through `object.__setattr__`. That was a tenth of a tick's
CPU. A record that `__init__` only stores (the `__init__` `@dataclass` wrote, no
`__post_init__`, every field an `__init__` argument, no `__slots__`, nothing cached in its
`__dict__`) is copied here as its `__dict__` with the changes laid on: the same object
`dataclasses.replace` builds. Any other class goes
through `dataclasses.replace` itself; a name that is not a field is refused the same way.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

T = TypeVar("T")

_plain: dict[type, frozenset[str] | None] = {}
"""Per class: its field names when its instances may be copied by ``__dict__``, else None."""


def _fields_if_plain(cls: type) -> frozenset[str] | None:
    if cls in _plain:
        return _plain[cls]
    fields = dataclasses.fields(cls)
    plain = (
        _generated_init(cls)
        and not hasattr(cls, "__post_init__")
        and not hasattr(cls, "__slots__")
        and all(f.init for f in fields)
        and not any(
            isinstance(value, functools.cached_property)
            for klass in cls.__mro__
            for value in vars(klass).values()
        )
    )
    found = _plain[cls] = frozenset(f.name for f in fields) if plain else None
    return found


def _generated_init(cls: type) -> bool:
    """Whether the ``__init__`` an instance is built by is the one ``@dataclass`` wrote: a class
    with its own ``__init__`` (``init=False``, one in the class body, which ``@dataclass`` keeps, or
    a subclass's override) may do more than store. ``@dataclass`` compiles the one it writes from
    source text, so its code comes from ``"<string>"``; a Python that did otherwise would send every
    record through `dataclasses.replace`: slower, never wrong."""
    owner = next(klass for klass in cls.__mro__ if "__init__" in vars(klass))
    params = vars(owner).get("__dataclass_params__")
    code = getattr(vars(owner)["__init__"], "__code__", None)
    return params is not None and bool(params.init) and code is not None and code.co_filename == "<string>"


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of the dataclass instance ``obj`` with ``changes``, as `dataclasses.replace`."""
    cls = type(obj)
    names = _fields_if_plain(cls)
    if names is None:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    if not names.issuperset(changes):
        unknown = ", ".join(sorted(set(changes) - names))
        raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument {unknown!r}")
    copy = object.__new__(cls)
    state = copy.__dict__
    state.update(obj.__dict__)
    state.update(changes)
    return copy
