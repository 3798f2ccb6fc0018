"""The Jinja2 environment: templates hold the C++ and only substitute the typed values Python
prepares (numbers, validated names, lists of small dataclasses)."""
from __future__ import annotations

import functools
import os
from pathlib import Path

import jinja2
import jinja2.bccache

from ... import cachedir


def template_dir() -> Path:
    """kgen/templates in an installed wheel (package data), else the checkout's templates/."""
    package = Path(__file__).resolve().parents[2]
    for folder in (package / "templates", package.parent / "templates"):
        if folder.is_dir():
            return folder
    raise FileNotFoundError(f"kgen's templates are missing: neither {package / 'templates'} "
                            f"nor {package.parent / 'templates'} exists")


class _PrivateBytecodeCache(jinja2.FileSystemBytecodeCache):
    """Jinja's bytecode cache is marshalled code: a file is loaded only if this user owns it and
    no one else can write it (the folder is private too: kgen.cachedir)."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        path = self._get_cache_filename(bucket)
        if os.path.exists(path) and not cachedir.is_private(path, directory=False):
            return
        super().load_bytecode(bucket)


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept next to the cubin cache (compiling them costs ~45 ms a run), in
    a folder only this user can write, else none (KGEN_CACHE=0 turns it off too)."""
    folder = cachedir.private_dir("templates")
    return _PrivateBytecodeCache(folder) if folder is not None else None


@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        bytecode_cache=_bytecode_cache(),
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        # inline PTX is full of `{%0, %1}`: blocks are written <% ... %> instead
        block_start_string="<%",
        block_end_string="%>",
    )


def render(template: str, **values) -> str:
    return environment().get_template(template).render(**values)


def render_lines(template: str, **values) -> list[str]:
    """A template that lays out lines of a function body (no indent of its own): its lines,
    for a caller that indents them where they go."""
    text = render(template, **values)
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def macro_lines(template: str, macro: str, **values) -> list[str]:
    """The lines macro `macro` of `template` lays out (no indent of its own), for a caller that
    hands them to another template."""
    text = str(getattr(environment().get_template(template).module, macro)(**values))
    if not text:
        return []
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")
