"""A module that is also its main function: `kgen.attention(q, k, v)` calls
`kgen.attention.attention`, and `kgen.attention.program`, `from kgen.attention import Signature`
and a monkeypatch read and write the module itself, however it was reached.

`make_callable(name, function)` puts in sys.modules, in the module's place, an object whose
__dict__ is the module's globals and whose __call__ is `function`. It is not a module object:
torch.compile calls no module (a module whose class was made callable broke the graph at each
call), but traces this object's __call__. `importlib.reload` does not take it.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["make_callable"]


class _Namespace:
    """A module's namespace, callable (see the module's note)."""

    def __call__(self, *args, **kwargs):
        return self.__dict__["__kgen_call__"](*args, **kwargs)

    def __repr__(self) -> str:
        name, call = self.__dict__["__name__"], self.__dict__["__kgen_call__"].__name__
        return (f"<module {name!r} from {self.__dict__.get('__file__')!r} (callable: "
                f"{name}.{call})>")


def make_callable(name: str, function: Callable[..., Any]) -> None:
    """Replace module `name` in sys.modules by its namespace, callable as `function`."""
    globals_ = vars(sys.modules[name])
    globals_["__kgen_call__"] = function
    namespace = _Namespace()
    namespace.__dict__ = globals_
    sys.modules[name] = namespace
