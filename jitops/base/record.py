"""``@record``: ``@dataclass(frozen=True)`` at a fraction of the class-creation cost (issue 32 item 4).

CPython 3.11's ``dataclass`` compiles each generated method with its own ``exec`` (six for a frozen
class: ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``), about
0.3-1.4 ms per class, paid at import on the warm ``get()`` / ``load()`` path by every value type there.
``record`` compiles only ``__init__`` (whose signature is the fields') and makes
the others closures that do what dataclass's generated ones do. The class stays a dataclass to the standard
library: ``__dataclass_fields__`` holds real ``dataclasses.Field`` objects, so ``dataclasses.replace``,
``fields``, ``asdict`` and ``is_dataclass`` work as before. Supported: plain defaults,
``field(default=..., default_factory=..., repr=..., compare=...)``, ``__post_init__``, an explicit
``__hash__``. Anything else (inheritance from a dataclass, ``ClassVar``, ``InitVar``, ``init=False``,
keyword-only fields) raises TypeError at class creation: use ``dataclass`` for those.

Imports: nothing of jitops.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import TYPE_CHECKING, Any, TypeVar

_T = TypeVar("_T", bound=type)
_MISSING = dataclasses.MISSING
_FACTORY = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", None) or type("_Factory", (), {"__repr__": lambda self: "<factory>"})()


def _fields_of(cls: type) -> list[dataclasses.Field[Any]]:
    if any(dataclasses.is_dataclass(base) for base in cls.__mro__[1:]):
        raise TypeError(f"@record {cls.__name__}: inherits from a dataclass; use @dataclass(frozen=True)")
    out: list[dataclasses.Field[Any]] = []
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        text = annotation if isinstance(annotation, str) else repr(annotation)
        if "ClassVar" in text or "InitVar" in text or "KW_ONLY" in text:
            raise TypeError(f"@record {cls.__name__}.{name}: ClassVar / InitVar / KW_ONLY need @dataclass")
        default = cls.__dict__.get(name, _MISSING)
        f: dataclasses.Field[Any] = default if isinstance(default, dataclasses.Field) else dataclasses.field(default=default)
        if not f.init or f.kw_only is True or f.hash is not None:
            raise TypeError(f"@record {cls.__name__}.{name}: init=False / kw_only / hash= need @dataclass")
        if isinstance(f.default, (list, dict, set)):  # as dataclass: a mutable default would be shared
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: use default_factory")
        f.name, f.type = name, annotation
        f._field_type = dataclasses._FIELD  # type: ignore[attr-defined]  # what dataclasses.replace reads
        f.kw_only = False  # type: ignore[assignment]
        if f.default is not _MISSING:
            setattr(cls, name, f.default)  # as dataclass: the class attribute is the default
        elif name in cls.__dict__:
            delattr(cls, name)
        out.append(f)
    return out


def _init_source(fields: list[dataclasses.Field[Any]], post_init: bool) -> str:
    """``__init__``, the one method compiled: its signature is the fields'."""
    params, body = ["self"], []
    seen_default = False
    for f in fields:
        if f.default is not _MISSING or f.default_factory is not _MISSING:
            params.append(f"{f.name}=_dflt_{f.name}" if f.default is not _MISSING else f"{f.name}=_HAS_FACTORY")
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        else:
            params.append(f.name)
        value = f"_dflt_{f.name}() if {f.name} is _HAS_FACTORY else {f.name}" \
            if f.default_factory is not _MISSING else f.name
        body.append(f"  __setattr(self, {f.name!r}, {value})")
    if post_init:
        body.append("  self.__post_init__()")
    return f"def __init__({', '.join(params)}):\n" + "\n".join(body or ["  pass"]) + "\n"


def _methods(cls: type, fields: list[dataclasses.Field[Any]]) -> dict[str, Any]:
    """``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__`` as closures (nothing to compile),
    each doing what dataclass's generated one does."""
    compared = [f.name for f in fields if f.compare]
    shown = [f.name for f in fields if f.repr]
    names = frozenset(f.name for f in fields)
    owner: Any = cls  # (mypy takes a `type` in a closure for an instance)
    getter = operator.attrgetter(*compared) if compared else None
    key: Any = (lambda self: ()) if getter is None else getter if len(compared) > 1 \
        else (lambda self: (getter(self),))  # always a tuple, as dataclass compares and hashes

    def __repr__(self: Any) -> str:
        return self.__class__.__qualname__ + "(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in shown) + ")"

    def __eq__(self: Any, other: object) -> Any:
        if other.__class__ is self.__class__:
            return key(self) == key(other)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(key(self))

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(owner, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(owner, self).__delattr__(name)

    return {"__repr__": __repr__, "__eq__": __eq__, "__hash__": __hash__, "__setattr__": __setattr__,
            "__delattr__": __delattr__}


def _replace(self: Any, /, **changes: Any) -> Any:
    return dataclasses.replace(self, **changes)


def _record(cls: _T) -> _T:
    """Make ``cls`` a frozen dataclass, as ``@dataclass(frozen=True)`` would (see the module docstring)."""
    fields = _fields_of(cls)
    own_hash = "__hash__" in cls.__dict__ and cls.__dict__["__hash__"] is not None
    namespace: dict[str, Any] = {"_HAS_FACTORY": _FACTORY, "__setattr": object.__setattr__}
    for f in fields:
        if f.default is not _MISSING:
            namespace[f"_dflt_{f.name}"] = f.default
        elif f.default_factory is not _MISSING:
            namespace[f"_dflt_{f.name}"] = f.default_factory
    exec(_init_source(fields, hasattr(cls, "__post_init__")), namespace)  # noqa: S102 - our own text
    methods = {"__init__": namespace["__init__"], **_methods(cls, fields)}
    methods["__init__"].__annotations__ = {**{f.name: f.type for f in fields}, "return": None}  # as dataclass's
    for method, fn in methods.items():
        if method == "__hash__" and own_hash:
            continue
        if method in ("__init__", "__repr__", "__eq__") and method in cls.__dict__:
            continue  # as dataclass: a method the class defines itself wins
        if method in ("__setattr__", "__delattr__") and method in cls.__dict__:
            raise TypeError(f"Cannot overwrite attribute {method} in class {cls.__name__}")
        fn.__qualname__ = f"{cls.__qualname__}.{method}"
        setattr(cls, method, fn)
    cls.__dataclass_fields__ = {f.name: f for f in fields}  # type: ignore[attr-defined]
    setattr(cls, "__replace__", _replace)  # noqa: B010 - copy.replace (3.13), as dataclass sets it there
    setattr(cls, "__match_args__", tuple(f.name for f in fields))  # noqa: B010 - mypy refuses the assignment
    if not getattr(cls, "__doc__", None):  # as dataclass: the signature
        import inspect

        try:
            cls.__doc__ = cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
        except (TypeError, ValueError):
            cls.__doc__ = cls.__name__
    return cls


if TYPE_CHECKING:  # so type checkers see a frozen dataclass: its __init__, its fields, no assignment
    from typing_extensions import dataclass_transform

    @dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
    def record(cls: _T) -> _T: ...
else:
    record = _record
