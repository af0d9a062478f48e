"""Regenerate ``omni_core/engine/sglang_args.py`` from the installed SGLang's ServerArgs.

Run in the SGLang environment (``make sglang-env``)::

    .venv-sglang/bin/python tools/gen_sglang_args.py            # rewrite the table
    .venv-sglang/bin/python tools/gen_sglang_args.py --check    # exit 1 if it would change

omni validates a stage's ``engine.*`` keys against this table in the parent
process, where SGLang is not imported (it takes ~30 s and may not be
installed at all), so the table is generated from the pinned version and a
test in ``make test-sglang`` checks that regenerating it changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from pathlib import Path

TARGET = Path(__file__).resolve().parents[1] / "omni_core" / "engine" / "sglang_args.py"
_SCALARS = {int: "int", float: "float", bool: "bool", str: "str"}


def _kind(annotation: object) -> str:
    """A small type language the parent can validate with: int, float, bool, str, list,
    dict, any, each optionally prefixed with ``?`` (None allowed); Literal as ``choice``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kind(typing.get_args(annotation)[0])
    if annotation in _SCALARS:
        return _SCALARS[annotation]  # type: ignore[index]
    if origin is typing.Literal:
        return "choice:" + json.dumps(list(typing.get_args(annotation)))
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = _kind(members[0]) if len(members) == 1 else "any"
        nullable = len(members) < len(typing.get_args(annotation))
        return ("?" if nullable and not inner.startswith("?") else "") + inner
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple):
        return "list"
    if origin is dict or annotation is dict:
        return "dict"
    return "any"


def _default(field: object) -> object:
    import msgspec

    default = field.default  # type: ignore[attr-defined]
    if default is msgspec.NODEFAULT:
        return None
    try:
        json.dumps(default)
    except (TypeError, ValueError):
        return None
    return default


def render() -> str:
    import msgspec
    import sglang
    from sglang.srt.server_args import ServerArgs

    hints = typing.get_type_hints(ServerArgs, include_extras=True)
    rows = []
    for field in msgspec.structs.fields(ServerArgs):
        annotation = hints.get(field.name, field.type)
        help_text = ""
        if typing.get_origin(annotation) is typing.Annotated:
            for meta in typing.get_args(annotation)[1:]:
                text = meta if isinstance(meta, str) else getattr(meta, "help", None)
                if text:
                    help_text = " ".join(str(text).split())
                    break
        if len(help_text) > 160:
            help_text = help_text[:157].rstrip() + "..."
        rows.append((field.name, _kind(annotation), _default(field), help_text))
    lines = [
        '"""SGLang ServerArgs fields: name -> (kind, default, help). GENERATED, do not edit.',
        "",
        "Written by tools/gen_sglang_args.py from the installed SGLang; see",
        "omni_core/engine/sglang_settings.py for how kinds are checked.",
        '"""',
        "",
        f"SGLANG_VERSION = {sglang.__version__!r}",
        "",
        "SERVER_ARGS: dict[str, tuple[str, object, str]] = {",
    ]
    for name, kind, default, help_text in rows:
        lines.append(f"    {name!r}: ({kind!r}, {default!r}, {help_text!r}),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET} is stale: run tools/gen_sglang_args.py", file=sys.stderr)
            return 1
        print(f"{TARGET}: up to date")
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET} ({text.count(chr(10)) - 9} fields)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
