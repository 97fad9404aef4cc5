"""How ``--help`` shows parameters: conventional metavars (``TEXT``,
``INTEGER``, ``TASK``) instead of Typer's Python types (``<str>``,
``<list[str]>``, ``{task}``), and nothing after a flag (``--json``, not
``--json <bool>``).

Typer has no setting for this, so the two display methods of its parameter
classes are replaced once, when the CLI is imported (never by the library).
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperOption

_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "bool": None}


def _type_name(param: Any) -> str | None:
    if param.metavar is not None:
        return str(param.metavar)
    if getattr(param, "is_flag", False):
        return None
    bare = param.bare_type()
    if bare.startswith("list["):
        inner = _NAMES.get(bare[5:-1], bare[5:-1].upper())
        return f"{inner}..." if inner else None
    return _NAMES.get(bare, bare.upper())


def _option_type(self: TyperOption, ctx: Any) -> str | None:
    return _type_name(self)


def _argument_type(self: TyperArgument, ctx: Any) -> str | None:
    return None  # the name column already says it (TASK, ID...)


def _argument_usage(self: TyperArgument) -> str:
    name = (self.metavar or (self.name or "").upper()).strip("[]")
    dots = "..." if self.nargs != 1 and not name.endswith("...") else ""
    return f"{name}{dots}" if self.required else f"[{name}]{dots}"


def _argument_name(self: TyperArgument) -> str:
    return str(self.metavar) if self.metavar is not None else (self.name or "").upper()


def install() -> None:
    """Replace Typer's parameter display (idempotent)."""
    TyperOption.display_type_rich = _option_type  # type: ignore[method-assign]
    TyperArgument.display_type_rich = _argument_type  # type: ignore[assignment,method-assign]
    TyperArgument._usage_display_name = _argument_usage  # type: ignore[method-assign]
    TyperArgument.display_name_raw = property(_argument_name)  # type: ignore[assignment,method-assign]
