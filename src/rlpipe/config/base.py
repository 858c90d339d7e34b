"""The base of every config section (strict, closed, finite) and its errors: ``ConfigError``
messages that name the dotted key, ``from_dict`` and ``to_dict``."""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A config value or key is invalid. The message names the dotted key."""


class _Invalid(ValueError):
    """A cross-field failure raised by a section's validator. ``@key`` in the message stands for
    that section's key and becomes the dotted key (``train.k``, ``variants.k4.k``)."""


DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"
_DEVICE_HELP = "'auto', 'cpu', 'cuda' or 'cuda:N'"


class _Section(BaseModel):
    """Base of every section: strict, finite, closed; direct construction raises ConfigError."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    _prefix: ClassVar[str] = ""  # the section's dotted key in a pipeline config

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError(_message(e, type(self), self._prefix)) from None

    # Marks this __init__ as pydantic's own (as RootModel does), so nested sections and
    # model_validate are validated by pydantic-core directly and keep their full error locations;
    # only a direct call (``DataConfig(val_fraction=1.5)``) goes through the conversion above.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _expand(msg: str, section: str) -> str:
    """``@key`` -> ``<section>.key`` in a cross-field message."""
    return re.sub(r"@([A-Za-z_][\w.]*)", lambda m: _join(section, m.group(1)), msg)


def _dotted(prefix: str, loc: tuple[Any, ...]) -> str:
    out = prefix
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else _join(out, str(part))
    return out


def _section_class(ann: Any) -> type[BaseModel] | None:
    """The section class in ``ann`` (``X`` or ``X | None``), else None."""
    for a in (ann, *typing.get_args(ann)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _model_at(cls: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section class that ``loc`` (a path of field names, and of the names of a table's
    entries such as ``families.<name>``) points into."""
    parts = iter(loc)
    for part in parts:
        field = cls.model_fields.get(str(part))
        ann = field.annotation if field else None
        if typing.get_origin(ann) is dict:  # a table of sections: the next part names an entry
            ann = typing.get_args(ann)[1]
            if next(parts, None) is None:
                return None
        section = _section_class(ann)
        if section is None:
            return None
        cls = section
    return cls


_BOUND_ERRORS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"),
                 "less_than_equal": ("le", "<="), "less_than": ("lt", "<")}


def _describe(err: dict[str, Any]) -> str:
    """What is wrong with the value, e.g. ``must be >= 1, got 0``."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _BOUND_ERRORS:
        name, op = _BOUND_ERRORS[kind]
        bound = ctx[name]
        msg = f"must be {op} {int(bound) if isinstance(bound, float) and bound.is_integer() else bound}"
    elif kind == "string_pattern_mismatch" and ctx.get("pattern") == DEVICE_PATTERN:
        msg = f"must be {_DEVICE_HELP}"
    elif kind == "finite_number":
        msg = "must be a finite number"
    elif kind == "too_short":
        msg = f"must have at least {ctx['min_length']} items"
    elif kind == "too_long":
        msg = f"must have at most {ctx['max_length']} items"
    elif kind == "string_too_short":
        msg = "must not be empty"
    else:
        msg = re.sub(r"^Input should\b", "must", err["msg"])
    return f"{msg}, got {err['input']!r}"


def _message(exc: ValidationError, cls: type[BaseModel], prefix: str) -> str:
    """One line per error of ``exc``, each naming the dotted key (``prefix`` + the error's loc)."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = _dotted(prefix, loc)
        error = (err.get("ctx") or {}).get("error")
        if err["type"] == "extra_forbidden":
            owner = _model_at(cls, loc[:-1])
            names = list(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(loc[-1]), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(names)}"
            lines.append(f"unknown config key '{key}'{hint}")
        elif isinstance(error, _Invalid):
            lines.append(_expand(str(error), key))
        elif err["type"] == "missing":
            lines.append(f"{key}: required")
        else:
            lines.append(f"{key}: {_describe(err)}")
    if len(lines) == 1:
        return lines[0]
    return f"{len(lines)} config errors:\n" + "\n".join(f"  - {line}" for line in lines)


def from_dict(cls: type[BaseModel], data: Any, prefix: str = "") -> Any:
    """Validate ``data`` as section ``cls``; errors name ``prefix`` + the dotted key."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_message(e, cls, prefix)) from None


def to_dict(obj: BaseModel) -> dict[str, Any]:
    """Plain data (dicts, lists, scalars) that ``yaml.safe_dump`` and ``json.dumps`` can write."""
    return obj.model_dump()
