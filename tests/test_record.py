"""base/record.py's ``@record`` behaves as ``@dataclass(frozen=True)`` for every use jitops makes of it (issue 32 item 4)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from jitops.base.record import record


def _pair(body: dict[str, Any], annotations: dict[str, str]) -> tuple[type, type]:
    """The same class body made twice: once by dataclass(frozen=True), once by record."""

    def make(deco: Any, name: str) -> type:
        ns = {"__annotations__": dict(annotations), "__module__": __name__, **body}
        ns = {k: (copy.copy(v) if isinstance(v, dataclasses.Field) else v) for k, v in ns.items()}
        return deco(type(name, (), ns))

    return make(dataclass(frozen=True), "Rec"), make(record, "Rec")


FIELDS = {
    "name": "str",
    "root": "Path",
    "tags": "tuple[str, ...]",
    "extra": "dict[str, Any]",
    "note": "str | None",
    "hidden": "int",
}
BODY = {
    "tags": (),
    "extra": field(default_factory=dict),
    "note": None,
    "hidden": field(default=3, repr=False, compare=False),
}


def test_record_matches_dataclass() -> None:
    d_cls, r_cls = _pair(BODY, FIELDS)
    for args, kw in [
        (("a", Path("/x")), {}),
        (("b", Path("/y"), ("t",)), {"note": "n", "hidden": 9}),
        ((), {"name": "c", "root": Path("/z"), "extra": {"k": 1}}),
    ]:
        d, r = d_cls(*args, **kw), r_cls(*args, **kw)
        assert (
            repr(d) == repr(r) and d.__dict__ == r.__dict__ and list(d.__dict__) == list(r.__dict__)
        )
        assert dataclasses.asdict(d) == dataclasses.asdict(r)
        assert [f.name for f in dataclasses.fields(d)] == [f.name for f in dataclasses.fields(r)]
        assert dataclasses.is_dataclass(r) and r.__match_args__ == d.__match_args__  # type: ignore[attr-defined]
        r2 = dataclasses.replace(r, note="changed", hidden=4)
        assert type(r2) is r_cls and r2.note == "changed" and r2.name == r.name and r2.hidden == 4
        # hidden: compare=False, as in d
        assert r2 != r and dataclasses.replace(r2, note=r.note) == r
        assert dataclasses.replace(d, note="changed", hidden=4) != d
        for obj in (d, r):
            with pytest.raises(
                dataclasses.FrozenInstanceError, match="cannot assign to field 'name'"
            ):
                obj.name = "x"  # type: ignore[misc]
            with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'name'"):
                del obj.name  # type: ignore[misc]
            with pytest.raises(dataclasses.FrozenInstanceError):
                obj.other = 1  # type: ignore[attr-defined]
        assert (r == r_cls(*args, **kw)) and (r != d) and r.__eq__(d) is NotImplemented
        assert copy.deepcopy(r) == r and copy.copy(d) == d
        if hasattr(copy, "replace"):  # Python 3.13
            assert copy.replace(r, note="x") == dataclasses.replace(r, note="x")
    assert d_cls("a", Path("/x")).extra is not d_cls("a", Path("/x")).extra
    # default_factory: a new dict each time
    assert r_cls("a", Path("/x")).extra is not r_cls("a", Path("/x")).extra
    assert r_cls.__doc__ == d_cls.__doc__ and r_cls.__doc__.startswith(
        "Rec(name: 'str', root: 'Path', tags"
    )  # type: ignore[union-attr]
    # class attributes as dataclass's
    assert r_cls.tags == () and r_cls.note is None and not hasattr(r_cls, "extra")
    # the fields' signature, not (*args, **kwargs)
    assert inspect.signature(r_cls) == inspect.signature(d_cls)
    for args, kw in [
        ((), {}),
        (("a",), {}),
        (("a", Path("/x")), {"bogus": 1}),
        (("a", Path("/x")), {"name": "b"}),
        (("a", Path("/x"), (), {}, None, 3, 4), {}),
    ]:
        with pytest.raises(TypeError) as d_err:
            d_cls(*args, **kw)
        with pytest.raises(TypeError) as r_err:
            r_cls(*args, **kw)
        assert str(r_err.value) == str(d_err.value)


def test_record_hash_post_init_and_own_methods() -> None:
    def post_init(self: Any) -> None:
        object.__setattr__(self, "tags", tuple(self.tags))

    body = {"tags": (), "__post_init__": post_init}
    d_cls, r_cls = _pair(body, {"name": "str", "tags": "tuple[str, ...]"})
    d, r = d_cls("a", ["x", "y"]), r_cls("a", ["x", "y"])
    assert r.tags == ("x", "y") == d.tags and hash(r) == hash(d) == hash(("a", ("x", "y")))
    assert {r, r_cls("a", ("x", "y"))} == {r}
    d_cls, r_cls = _pair(
        {"__hash__": lambda self: 7, "__repr__": lambda self: "mine"}, {"name": "str"}
    )
    assert (
        hash(r_cls("a")) == hash(d_cls("a")) == 7 and repr(r_cls("a")) == repr(d_cls("a")) == "mine"
    )
    d_cls, r_cls = _pair({}, {"name": "str"})  # one field: still hashed and compared as a 1-tuple
    assert hash(r_cls("a")) == hash(d_cls("a")) == hash(("a",)) and r_cls("a") == r_cls(
        "a"
    ) != r_cls("b")
    d_cls, r_cls = _pair({}, {})
    assert (
        r_cls() == r_cls()
        and repr(r_cls()) == repr(d_cls()) == "Rec()"
        and hash(r_cls()) == hash(d_cls())
    )


def test_record_refuses_what_it_does_not_implement() -> None:
    @dataclass(frozen=True)
    class Base:
        a: int

    with pytest.raises(TypeError, match="inherits from a dataclass"):
        record(type("Sub", (Base,), {"__annotations__": {"b": "int"}}))
    with pytest.raises(TypeError, match="ClassVar"):
        record(type("C", (), {"__annotations__": {"b": ClassVar[int]}}))
    with pytest.raises(TypeError, match="init=False"):
        record(type("C", (), {"__annotations__": {"b": "int"}, "b": field(default=1, init=False)}))
    with pytest.raises(TypeError, match="non-default argument"):
        record(type("C", (), {"__annotations__": {"a": "int", "b": "int"}, "a": 1}))
    with pytest.raises(ValueError, match="mutable default"):
        record(type("C", (), {"__annotations__": {"a": "list[int]"}, "a": []}))
    with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__"):
        record(
            type("C", (), {"__annotations__": {"a": "int"}, "__setattr__": lambda self, n, v: None})
        )
