"""Standard modules a command imports only when something uses them (issue 16: ``status``, ``list``
and ``submit`` start in <= 150 ms).

``dataclasses`` imports :mod:`inspect` (and with it ``ast``, ``dis``, ``tokenize`` and ``linecache``:
~15 ms of a command's start on a 2-core VM) for one line: the docstring it writes for a dataclass
that has none. Every dataclass a command defines has its own. :func:`defer` puts a stand-in in
``sys.modules`` that imports the module itself at the first use of any attribute of it
(``from inspect import signature`` included), as Mercurial's ``demandimport`` does for its own start.

Only for modules nothing imported yet: a command run inside a process that has them (a test, a
server) changes nothing there. The command line's own process only: the library never does it.
After the first use, the stand-in holds the module's names (for whoever kept a reference to it),
and ``sys.modules`` the module itself; a name set on the module later is not seen through the
stand-in.
"""

from __future__ import annotations

import _thread
import sys
from types import ModuleType  # (imported by now: typing, argparse and enum import it)

_LOCK = _thread.RLock()  # two threads using a stand-in at once import it once; a use while importing it never hangs


class _Deferred(ModuleType):
    """The stand-in of a module not imported yet."""

    def __getattr__(self, attr: str) -> object:
        name = self.__name__
        with _LOCK:
            if sys.modules.get(name) is self:
                del sys.modules[name]  # the import system imports the module itself now
            __import__(name)
            module = sys.modules[name]
        self.__dict__.update(module.__dict__)
        return getattr(module, attr)


def defer(*names: str) -> None:
    """A stand-in for each of ``names`` not imported yet (top-level modules only)."""
    for name in names:
        if name not in sys.modules:
            sys.modules[name] = _Deferred(name)
