"""Code-edit search, karpathy/autoresearch style, with git doing the bookkeeping.

The LLM proposer (``llm.py`` with a plan's ``code: {files, instructions}``) asks for
search/replace edits on top of the best version so far. This module turns edits
into a unified diff against the workdir's base commit, reads the files as a patch
leaves them, and gives each trial its own git worktree with its patch applied:

* **keep/discard**: the incumbent (best finished trial) is the base of every new
  proposal; a patch that does not beat it is simply never built upon.
* **every patch is stored**: patches are cumulative (base commit -> trial), so any
  one of them recreates its trial exactly; the first line names the base commit
  (``# autoresearch base <sha>``), which ``git apply`` ignores.
* nothing touches the user's checkout: diffs are computed in a throwaway index
  (``GIT_INDEX_FILE``), trials run in worktrees under the loop's directory.

The controller calls :func:`prepare_trial_workdir` before launching a code trial
and :func:`cleanup_worktrees` when the loop ends. The proposer that uses all this is
:class:`~autoresearch.loop.proposers.code.CodeProposer` (``code.py``, which re-exports these
names); this module imports no proposer, so ``llm.py`` and ``code.py`` both build on it.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from autoresearch.errors import PlanError, SpecError
from autoresearch.loop.proposers._gate import Rejected

BASE_HEADER = "# autoresearch base "
MARKER = ".autoresearch-patch"  # in a trial worktree: sha256 of the patch applied there
GIT_HINT = "make the workdir a git repository: git init && git add -A && git commit -m base"


def _git(repo: str | Path, *args: str, input: str | None = None, env: dict[str, str] | None = None,
         check: bool = True) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=60)
    except FileNotFoundError:
        raise PlanError("code-edit search needs git, which is not installed",
                        hint="install git, or drop the plan's code: section") from None
    if check and done.returncode != 0:
        raise _GitFailed(done.stderr.strip() or done.stdout.strip())
    return done.stdout


class _GitFailed(Exception):
    pass


def repo_root(workdir: str | Path) -> Path:
    try:
        return Path(_git(workdir, "rev-parse", "--show-toplevel").strip())
    except _GitFailed:
        raise PlanError(f"code-edit search needs a git repository, and {workdir} is not in one",
                        hint=GIT_HINT) from None


def patch_base(patch: str | None) -> str | None:
    if patch and patch.startswith(BASE_HEADER):
        return patch[len(BASE_HEADER):].split("\n", 1)[0].strip() or None
    return None


class CodeSearch:
    """The files an LLM may edit, read and diffed against one base commit."""

    def __init__(self, workdir: str | Path, files: list[str], instructions: str | None = None) -> None:
        self.workdir = Path(workdir).expanduser().resolve()
        self.check(self.workdir, files)
        self.root = repo_root(self.workdir)
        self.prefix = os.path.relpath(self.workdir, self.root)
        self.files = list(files)
        self.instructions = _read_instructions(self.workdir, instructions)
        head = _git(self.root, "rev-parse", "HEAD").strip()
        # Uncommitted edits to tracked files are part of the base (a commit object that
        # touches neither the branch nor the checkout); untracked files are not.
        dirty = _git(self.root, "stash", "create", check=False).strip()
        self.base = dirty or head

    @staticmethod
    def check(workdir: str | Path, files: list[str]) -> None:
        """Preflight at plan load: a git repo, committed, with every listed file in it."""
        workdir = Path(workdir).expanduser()
        if not workdir.is_dir():
            raise PlanError(f"workdir {workdir} does not exist", hint="set trial.workdir to the code's directory")
        if not files:
            raise PlanError("code.files is empty", hint="list the files the LLM may edit, e.g. code: {files: [train.py]}")
        root = repo_root(workdir)
        if _git(root, "rev-parse", "--verify", "-q", "HEAD", check=False).strip() == "":
            raise PlanError(f"the git repository at {root} has no commit yet", hint=GIT_HINT)
        for name in files:
            path = (workdir / name).resolve()
            if not path.is_file():
                raise PlanError(f"code.files lists {name!r}, which is not a file in {workdir}",
                                hint="paths in code.files are relative to trial.workdir")
            rel = os.path.relpath(path, root)
            if rel.startswith(".."):
                raise PlanError(f"code file {name!r} is outside the git repository {root}", hint=GIT_HINT)
            if not _git(root, "ls-files", "--", rel).strip():
                raise PlanError(f"code file {name!r} is not committed to git",
                                hint=f"git add {name} && git commit -m 'add {name}'")

    def _path(self, name: str) -> str:
        return os.path.normpath(os.path.join(self.prefix, name))

    def files_at(self, patch: str | None) -> dict[str, str]:
        """The listed files as ``patch`` (cumulative, from the base) leaves them."""
        with tempfile.TemporaryDirectory(prefix="ar-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            _git(self.root, "read-tree", patch_base(patch) or self.base, env=env)
            if patch and patch.strip():
                try:
                    _git(self.root, "apply", "--cached", "--whitespace=nowarn", "-", input=_body(patch), env=env)
                except _GitFailed as err:
                    raise Rejected(f"the base patch no longer applies: {err}") from None
            return {name: _git(self.root, "show", f":{self._path(name)}", env=env) for name in self.files}

    def make_patch(self, base_patch: str | None, edits: list[dict[str, Any]]) -> str:
        """A cumulative unified diff: ``base_patch`` plus ``edits``; :class:`Rejected` with the reason."""
        if not edits:
            raise Rejected("no edits")
        contents = self.files_at(base_patch)
        changed: dict[str, str] = {}
        for i, edit in enumerate(edits, 1):
            if not isinstance(edit, dict):
                raise Rejected(f"edit {i} is not an object")
            name, search, replace = edit.get("file"), edit.get("search"), edit.get("replace")
            if name not in contents:
                raise Rejected(f"edit {i} touches {name!r}; only {', '.join(self.files)} may be edited")
            if not isinstance(search, str) or not isinstance(replace, str) or not search:
                raise Rejected(f"edit {i} needs non-empty 'search' and a 'replace' string")
            text = changed.get(name, contents[name])
            count = text.count(search)
            if count != 1:
                where = "does not occur" if count == 0 else f"occurs {count} times"
                raise Rejected(f"edit {i}: the search text {where} in {name} (copy a unique snippet verbatim): "
                               f"{search[:80]!r}")
            changed[name] = text.replace(search, replace, 1)
        base = patch_base(base_patch) or self.base
        with tempfile.TemporaryDirectory(prefix="ar-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            _git(self.root, "read-tree", base, env=env)
            if base_patch and base_patch.strip():
                _git(self.root, "apply", "--cached", "--whitespace=nowarn", "-", input=_body(base_patch), env=env)
            for name, text in changed.items():
                blob = _git(self.root, "hash-object", "-w", "--stdin", input=text).strip()
                mode = _git(self.root, "ls-files", "-s", "--", self._path(name), env=env).split(" ", 1)[0] or "100644"
                _git(self.root, "update-index", "--cacheinfo", f"{mode},{blob},{self._path(name)}", env=env)
            tree = _git(self.root, "write-tree", env=env).strip()
        diff = _git(self.root, "diff", "--no-color", "--no-ext-diff", base, tree)
        if not diff.strip():
            raise Rejected("the edits change nothing")
        if base_patch and diff == _body(base_patch):
            raise Rejected("the edits change nothing relative to the base trial")
        return f"{BASE_HEADER}{base}\n{diff}"


def _body(patch: str) -> str:
    return patch.split("\n", 1)[1] if patch.startswith(BASE_HEADER) else patch


def _read_instructions(workdir: Path, instructions: str | None) -> str:
    if not instructions:
        return "(none given)"
    path = workdir / instructions
    if "\n" not in instructions and len(instructions) < 256 and path.is_file():
        return path.read_text(errors="replace")
    return instructions


# -- trial worktrees (called by the controller) ---------------------------------------------


def prepare_trial_workdir(workdir: str | Path, patch: str | None, dest: str | Path) -> Path:
    """A git worktree at ``dest`` with ``patch`` applied; returns the trial's workdir inside it.

    Idempotent: a worktree already prepared with the same patch (a resumed loop) is
    reused as it is, outputs included.
    """
    workdir = Path(workdir).expanduser().resolve()
    dest = Path(dest).expanduser().resolve()
    root = repo_root(workdir)
    prefix = os.path.relpath(workdir, root)
    digest = hashlib.sha256((patch or "").encode()).hexdigest()
    marker = dest / MARKER
    if _read_marker(marker) == digest:
        return dest / prefix
    base = patch_base(patch) or _git(root, "rev-parse", "HEAD").strip()
    try:
        if dest.exists():
            _git(root, "worktree", "remove", "--force", str(dest), check=False)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _git(root, "worktree", "add", "--detach", "--force", str(dest), base)
        if patch and patch.strip():
            _git(dest, "apply", "--whitespace=nowarn", "-", input=_body(patch))
    except _GitFailed as err:
        raise SpecError(f"cannot prepare the trial's worktree at {dest}: {err}",
                        hint="the patch may not apply to the current base commit; see the trial's stored patch") from None
    try:  # never through a link: a patch (or a trial, in its worktree) may have put one there
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise SpecError(f"cannot mark the trial's worktree at {dest}: {MARKER} is {err.strerror}",
                        hint=f"a patch must not create {MARKER} (it is autoresearch's own file)") from None
    with os.fdopen(fd, "w") as out:
        out.write(digest + "\n")
    return dest / prefix


def _read_marker(marker: Path) -> str:
    """The marker's digest, '' when there is none, it is a link or it is no regular file."""
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        return f.read(200).decode(errors="replace").strip()


def cleanup_worktrees(workdir: str | Path, under: str | Path, keep: tuple[str, ...] = ()) -> int:
    """Remove the trial worktrees below ``under`` (except names in ``keep``); returns how many."""
    root = repo_root(workdir)
    under = Path(under).expanduser().resolve()
    removed = 0
    if under.is_dir():
        for child in sorted(under.iterdir()):
            if child.name in keep or not (child / MARKER).exists():
                continue
            _git(root, "worktree", "remove", "--force", str(child), check=False)
            removed += 1
    _git(root, "worktree", "prune", check=False)
    return removed
