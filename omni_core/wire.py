"""Which Python classes may travel inside a message between processes.

Why an allowlist: a message's skeleton is decoded with pickle, and an
unrestricted unpickler runs whatever callable the bytes name. The decoder of
the built-in transports builds only plain data (str, numbers, bytes, lists,
tuples, dicts, sets, None), tensors, arrays and bytes carried as raw
buffers, the runtime's own :class:`~omni_core.runtime.messages.Envelope`,
and the classes listed here. The sender checks the same list, so a stage
that puts, say, a function or an unregistered object into a payload fails
that request with a message naming the type, on the side that made it.

Plugins add their payload classes (dataclasses, enums, named tuples: types
whose construction runs no code of consequence) with the
``omni_register_wire_types`` hook; tests and embedders may call
:func:`allow_wire_types` directly. The list only grows within a process.
"""

from __future__ import annotations

from collections.abc import Iterable

# Builtins that pickle by naming a global (the other plain types have opcodes of their own).
_DEFAULT = frozenset(
    {
        "builtins:complex",
        "builtins:slice",
        "builtins:range",
        "collections:OrderedDict",
        "omni_core.runtime.messages:Envelope",
        # The engine's own request settings, which every engine stage's input carries.
        "omni_core.engine.interface:SamplingParams",
    }
)
_allowed: set[str] = set(_DEFAULT)


class WireTypeError(TypeError):
    """A message holds an object of a type that may not cross between processes."""


def type_name(item: type | str) -> str:
    """``module:Qualname`` of a class, or a string already in that form (checked)."""
    if isinstance(item, str):
        module, sep, qualname = item.partition(":")
        if not sep or not module or not qualname:
            raise ValueError(f"wire type {item!r} is not 'module:Qualname'")
        return item
    if isinstance(item, type):
        return f"{item.__module__}:{item.__qualname__}"
    raise TypeError(f"a wire type is a class or 'module:Qualname', not {type(item).__name__}")


def allow_wire_types(items: Iterable[type | str]) -> None:
    """Let these classes travel in messages decoded by this process."""
    _allowed.update(type_name(item) for item in items)


def is_allowed(module: str, qualname: str) -> bool:
    return f"{module}:{qualname}" in _allowed


def allowed_wire_types() -> frozenset[str]:
    return frozenset(_allowed)


def refuse(obj: object) -> WireTypeError:
    """The error for an object whose type is not allowed on the wire."""
    cls = obj if isinstance(obj, type) else type(obj)
    what = "class object" if isinstance(obj, type) else "object"
    return WireTypeError(
        f"a message between processes holds a {what} of type {type_name(cls)}, which may not "
        "cross a process boundary: messages carry plain data (str, numbers, bytes, lists, "
        "tuples, dicts, sets, None), tensors, numpy arrays and registered types; convert it "
        "to plain data, or register the class with the omni_register_wire_types hook"
    )
