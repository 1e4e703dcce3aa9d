"""``@record``: ``@dataclass(frozen=True)`` at a fraction of the class-creation cost.

CPython 3.11's ``dataclass`` compiles each generated method with its own ``exec`` (six for a frozen
class: ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``), about
0.3-1.4 ms per class, paid at import on the warm ``get()`` / ``load()`` path by every value type there.
``record`` compiles nothing: every method is a closure that does what dataclass's generated one does;
``__init__`` binds its arguments by the fields' order, defaults and factories and raises the TypeErrors a
compiled one would; the class's ``__signature__`` (built on first use) is the fields', so
``inspect.signature(cls)`` and the default docstring are dataclass's (``inspect.signature(cls.__init__)``
shows ``*args, **kwargs``). A compiled ``__init__`` cost ~0.1 ms a class: 2-3 ms of the warm
``load()`` in a fresh process. The class stays a dataclass to the standard
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
_FACTORY = (
    getattr(dataclasses, "_HAS_DEFAULT_FACTORY", None)
    or type("_Factory", (), {"__repr__": lambda self: "<factory>"})()
)


def _fields_of(cls: type) -> list[dataclasses.Field[Any]]:
    if any(dataclasses.is_dataclass(base) for base in cls.__mro__[1:]):
        raise TypeError(
            f"@record {cls.__name__}: inherits from a dataclass; use @dataclass(frozen=True)"
        )
    out: list[dataclasses.Field[Any]] = []
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        text = annotation if isinstance(annotation, str) else repr(annotation)
        if "ClassVar" in text or "InitVar" in text or "KW_ONLY" in text:
            raise TypeError(
                f"@record {cls.__name__}.{name}: ClassVar / InitVar / KW_ONLY need @dataclass"
            )
        default = cls.__dict__.get(name, _MISSING)
        f: dataclasses.Field[Any] = (
            default
            if isinstance(default, dataclasses.Field)
            else dataclasses.field(default=default)
        )
        if not f.init or f.kw_only is True or f.hash is not None:
            raise TypeError(
                f"@record {cls.__name__}.{name}: init=False / kw_only / hash= need @dataclass"
            )
        # as dataclass: a mutable default would be shared
        if isinstance(f.default, (list, dict, set)):
            raise ValueError(
                f"mutable default {type(f.default)} for field {name} is not allowed: use default_factory"
            )
        f.name, f.type = name, annotation
        f._field_type = dataclasses._FIELD  # type: ignore[attr-defined]  # what dataclasses.replace reads
        f.kw_only = False  # type: ignore[assignment]
        if f.default is not _MISSING:
            setattr(cls, name, f.default)  # as dataclass: the class attribute is the default
        elif name in cls.__dict__:
            delattr(cls, name)
        out.append(f)
    return out


def _init(cls: type, fields: list[dataclasses.Field[Any]], post_init: bool) -> Any:
    """``__init__`` as a closure (nothing compiled): positional and keyword arguments bound to the fields in order,
    a default or a fresh ``default_factory()`` for each one left out, TypeError as CPython words it."""
    names = tuple(f.name for f in fields)
    index = {n: i for i, n in enumerate(names)}
    fill: list[
        tuple[bool, Any]
    ] = []  # per field: (is a factory, the default or factory), or (False, _MISSING)
    seen_default = False
    for f in fields:
        if f.default is not _MISSING:
            fill.append((False, f.default))
            seen_default = True
        elif f.default_factory is not _MISSING:
            fill.append((True, f.default_factory))
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        else:
            fill.append((False, _MISSING))
    count, setter, where = len(names), object.__setattr__, f"{cls.__qualname__}.__init__()"
    required = sum(1 for _, default in fill if default is _MISSING)
    takes = f"{count + 1}" if required == count else f"from {required + 1} to {count + 1}"

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > count:
            raise TypeError(
                f"{where} takes {takes} positional arguments but {len(args) + 1} were given"
            )
        values = list(args) + [_MISSING] * (count - len(args))
        for name, value in kwargs.items():
            i = index.get(name)
            if i is None:
                raise TypeError(f"{where} got an unexpected keyword argument {name!r}")
            if i < len(args):
                raise TypeError(f"{where} got multiple values for argument {name!r}")
            values[i] = value
        missing = [
            names[i] for i, v in enumerate(values) if v is _MISSING and fill[i][1] is _MISSING
        ]
        if missing:
            quoted = [repr(n) for n in missing]
            listed = (
                quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
            )
            raise TypeError(
                f"{where} missing {len(missing)} required positional argument"
                f"{'s' if len(missing) > 1 else ''}: {listed}"
            )
        for i, value in enumerate(values):
            if value is _MISSING:
                factory, default = fill[i]
                value = default() if factory else default
            setter(self, names[i], value)
        if post_init:
            self.__post_init__()

    return __init__


class _Signature:
    """``cls.__signature__``: what ``inspect.signature(cls)`` reads before it looks at ``__init__``. Built on
    first use (the fields, their annotations and defaults; a factory shows as dataclass's ``<factory>``),
    not at class creation; an instance has none, as a dataclass's has none."""

    __slots__ = ("_fields", "_built")

    def __init__(self, fields: list[dataclasses.Field[Any]]) -> None:
        self._fields = fields
        self._built: Any = None

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is not None:
            raise AttributeError("__signature__")
        if self._built is None:
            import inspect  # (torch has imported it already)

            kind, empty = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty
            params = [
                inspect.Parameter(
                    f.name,
                    kind,
                    annotation=f.type,
                    default=f.default
                    if f.default is not _MISSING
                    else _FACTORY
                    if f.default_factory is not _MISSING
                    else empty,
                )
                for f in self._fields
            ]
            self._built = inspect.Signature(params, return_annotation=None)
        return self._built


def _methods(cls: type, fields: list[dataclasses.Field[Any]]) -> dict[str, Any]:
    """``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__`` as closures (nothing to compile),
    each doing what dataclass's generated one does."""
    compared = [f.name for f in fields if f.compare]
    shown = [f.name for f in fields if f.repr]
    names = frozenset(f.name for f in fields)
    owner: Any = cls  # (mypy takes a `type` in a closure for an instance)
    getter = operator.attrgetter(*compared) if compared else None
    # always a tuple, as dataclass compares and hashes
    key: Any = (
        (lambda self: ())
        if getter is None
        else getter
        if len(compared) > 1
        else (lambda self: (getter(self),))
    )

    def __repr__(self: Any) -> str:
        return (
            self.__class__.__qualname__
            + "("
            + ", ".join(f"{n}={getattr(self, n)!r}" for n in shown)
            + ")"
        )

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

    return {
        "__repr__": __repr__,
        "__eq__": __eq__,
        "__hash__": __hash__,
        "__setattr__": __setattr__,
        "__delattr__": __delattr__,
    }


def _replace(self: Any, /, **changes: Any) -> Any:
    return dataclasses.replace(self, **changes)


def _record(cls: _T) -> _T:
    """Make ``cls`` a frozen dataclass, as ``@dataclass(frozen=True)`` would (see the module docstring)."""
    fields = _fields_of(cls)
    own_hash = "__hash__" in cls.__dict__ and cls.__dict__["__hash__"] is not None
    methods = {
        "__init__": _init(cls, fields, hasattr(cls, "__post_init__")),
        **_methods(cls, fields),
    }
    # as dataclass's
    methods["__init__"].__annotations__ = {
        **{f.name: f.type for f in fields},
        "return": None,
    }
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
    if "__signature__" not in cls.__dict__:
        setattr(cls, "__signature__", _Signature(fields))  # noqa: B010 - mypy refuses the assignment
    setattr(cls, "__replace__", _replace)  # noqa: B010 - copy.replace (3.13), as dataclass sets it there
    setattr(cls, "__match_args__", tuple(f.name for f in fields))  # noqa: B010 - mypy refuses the assignment
    if not getattr(cls, "__doc__", None):  # as dataclass: the signature
        import inspect

        try:
            cls.__doc__ = cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
        except (TypeError, ValueError):
            cls.__doc__ = cls.__name__
    return cls


# so type checkers see a frozen dataclass: its __init__, its fields, no assignment
if TYPE_CHECKING:
    from typing_extensions import dataclass_transform

    @dataclass_transform(
        frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field)
    )
    def record(cls: _T) -> _T: ...
else:
    record = _record
