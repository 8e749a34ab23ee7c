"""``logs --grep`` with a time limit: a pattern like ``(a+)+$`` must not burn a CPU for minutes.

Python's ``re`` has no timeout and does not release the GIL, and a single line of 30
characters is enough for exponential backtracking, so neither a per-line length cap nor a
budget checked between lines bounds it. The matching therefore runs in a child
interpreter (``python -I -S``, ~20-50 ms to start) that is killed at the deadline; the
caller gets a clear error instead of a hung server. The child only sees the log's bytes
(on stdin) and the pattern, and answers with the numbers of the matching lines.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from autoresearch.errors import SpecError

TIMEOUT_S = 5.0
MAX_PATTERN = 1000

_CHILD = r"""
import json, re, sys
pattern = re.compile(json.loads(sys.argv[1]))
lines = sys.stdin.buffer.read().decode("utf-8", "replace").splitlines()
sys.stdout.write("\n".join(str(i) for i, line in enumerate(lines) if pattern.search(line)))
"""


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """The pattern compiled here (errors, length) before any child starts."""
    if len(pattern) > MAX_PATTERN:
        raise SpecError(f"grep pattern is {len(pattern)} characters long (at most {MAX_PATTERN})",
                        hint="grep for a shorter, distinctive part of the line")
    if "\0" in pattern:
        raise SpecError("grep pattern contains a NUL byte", hint="write \\x00 to match a NUL byte")
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as err:
        raise SpecError(f"grep {pattern!r} is not a valid regular expression: {err}",
                        hint="escape special characters, e.g. 'loss\\\\s*='") from None


def matching_lines(pattern: str, data: bytes, timeout_s: float = TIMEOUT_S) -> list[int]:
    """Indexes of the lines of ``data`` (decoded like the log pages) in which ``pattern`` is found."""
    compile_pattern(pattern)
    try:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", _CHILD, json.dumps(pattern)], input=data, capture_output=True,
                             timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:  # run() has killed the child already
        raise SpecError(f"grep {pattern!r} took more than {timeout_s:g} s on this log and was stopped",
                        hint="simplify the pattern (no nested repeats like (a+)+ or (.*)*), "
                             "or read pages with tail_lines/offset") from None
    if out.returncode != 0:
        detail = out.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        raise SpecError(f"grep {pattern!r} failed: {detail[0][:200]}", hint="simplify the pattern")
    return [int(i) for i in out.stdout.split()]
