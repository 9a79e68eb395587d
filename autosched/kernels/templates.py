"""Kernel sources as template files, rendered strictly.

A family keeps its Triton or Gluon source in files beside its code (`*.py.tmpl`, shipped as
package data). `string.Template.safe_substitute` left a misspelt or forgotten placeholder in
the kernel, where Triton reported it far from its cause; here a placeholder without a value,
or a value without a placeholder, is an error at rendering.
"""

from __future__ import annotations

import string
from functools import cache
from importlib.resources import files

from autosched.ops.epilogue import Epilogue


class TemplateError(ValueError):
    """A template and its values do not match."""


@cache
def template_text(package: str, name: str) -> str:
    """The text of template file `name` of `package` (read once a process)."""
    return files(package).joinpath(name).read_text(encoding="utf-8")


def placeholders(text: str) -> set[str]:
    """The names `$name` or `${name}` in a template's text (`$$` is a dollar)."""
    found = set()
    for match in string.Template.pattern.finditer(text):
        if match.group("invalid") is not None:
            raise TemplateError(f"a lone $ at offset {match.start()}")
        name = match.group("named") or match.group("braced")
        if name:
            found.add(name)
    return found


def render_text(text: str, values: dict[str, object], where: str = "template") -> str:
    """`text` with each placeholder replaced by its value; every placeholder must have a
    value and every value a placeholder."""
    names = placeholders(text)
    missing = sorted(names - set(values))
    unused = sorted(set(values) - names)
    if missing or unused:
        raise TemplateError(f"{where}: no value for {missing}, no placeholder for {unused}")
    return string.Template(text).substitute(values)


def render(package: str, name: str, **values: object) -> str:
    """Template file `name` of `package`, rendered strictly (`render_text`)."""
    return render_text(template_text(package, name), values, f"{package}/{name}")


def epilogue_values(
    epilogue: Epilogue | None, names: tuple[str, ...], indent: int = 1
) -> dict[str, str]:
    """A kernel template's `params` (the epilogue's pointers, each followed by ", ") and
    `epilogue` (its loads and statements, `indent` levels in; `out = acc` without one);
    `names`: the template's output-channel index and count, and the output tile's offsets
    and mask (`Epilogue.triton_lines`)."""
    margin = "    " * indent
    if epilogue is None:
        return {"params": "", "epilogue": f"{margin}out = acc"}
    params, body = epilogue.triton_lines(*names)
    return {
        "params": "".join(f"{p}, " for p in params),
        "epilogue": "\n".join(f"{margin}{line}" for line in body),
    }


def indented(text: str, margin: str = "    ") -> str:
    """Each line of `text` one level further in."""
    return "\n".join(f"{margin}{line}" for line in text.splitlines())
