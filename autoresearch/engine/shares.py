"""Fair share and quotas across projects: ``scheduler:`` in ``$AUTORESEARCH_HOME/config.yaml``.

    scheduler:
      default_weight: 1            # a project not listed below
      half_life: 7d                # past usage counts half after this long (s, m, h, d, w or seconds)
      projects:
        vision: {weight: 2, guaranteed: 8, borrow: 8}
        nlp:    {weight: 1, gpu_quota: 4}

With the section present the pass orders each priority class by the projects' dominant
share (now, plus past usage decayed with ``half_life``) over weight, holds a project's normal
and critical work to its cap (``gpu_quota``, or ``guaranteed + borrow``) and lets a project
below its ``guaranteed`` GPUs preempt the normal attempts of projects that borrow
(``scheduler.schedule(fair=..., past=...)``; docs/scheduling.md). Without it: submit order,
no quotas.

Past usage is a decayed accumulator, never a scan of history: :class:`~autoresearch.util.decay.Decayed` (the
simulated fleet's driver keeps one) and ``JobStore.share_usage`` (the ledger's, folded from the attempts'
'end' events past a cursor) hold each project's GPU-seconds decayed to a time, and
:func:`accrued` adds what the running attempts used so far. The file is read (and cached) by ``backends/profiles.py`` (``profiles.fair_share(home)``),
which never is imported here; this module turns its
section into a :class:`~autoresearch.engine.scheduler.FairShare` and checks quotas against the fleet.
"""

from __future__ import annotations

import math
from typing import Any

from autoresearch.engine.scheduler import DAY, FairShare, Share
from autoresearch.errors import CapacityError, SpecError, check_section
from autoresearch.util.decay import Decayed, accrued, decayed

__all__ = ["Decayed", "accrued", "check", "decayed", "half_life_s", "parse"]

_KEYS = ("projects", "default_weight", "half_life")
_PROJECT_KEYS = ("weight", "gpu_quota", "guaranteed", "borrow")
MAX_PROJECTS = 10_000
MAX_WEIGHT = 1e6
MAX_QUOTA = 1 << 31
MAX_HALF_LIFE = 10 * 365 * DAY
EXAMPLE = "scheduler: {projects: {NAME: {weight: 2, guaranteed: 8, borrow: 8}}, default_weight: 1, half_life: 7d}"
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY, "w": 7 * DAY}


def parse(raw: Any) -> FairShare | None:
    """The ``scheduler:`` section -> FairShare (None when empty); SpecError naming the bad key."""
    if raw is None:
        return None
    check_section(raw, "scheduler", _KEYS, EXAMPLE, _near)
    default = _weight(raw.get("default_weight", 1), "scheduler.default_weight")
    half_life = half_life_s(raw.get("half_life", "7d"))
    projects = raw.get("projects") or {}
    if not isinstance(projects, dict):
        raise SpecError(f"scheduler.projects must be a mapping of project -> {{weight, gpu_quota}}, got "
                        f"{type(projects).__name__}", hint=f"write {EXAMPLE}")
    if len(projects) > MAX_PROJECTS:
        raise SpecError(f"scheduler.projects lists {len(projects)} projects (at most {MAX_PROJECTS})",
                        hint="list the projects that need their own weight or quota; the rest get default_weight")
    out: dict[str, Share] = {}
    for name, body in projects.items():
        if not isinstance(name, str) or not name or len(name) > 200 or any(ord(ch) < 32 for ch in name):
            raise SpecError(f"scheduler.projects: {str(name)[:60]!r} is not a project name",
                            hint="use the project name jobs are submitted under (one line of text)")
        where = f"scheduler.projects.{name[:60]}"
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise SpecError(f"{where} must be a mapping {{weight, gpu_quota}}, got {type(body).__name__}",
                            hint=f"write {name[:60]}: {{weight: 1, gpu_quota: 8}}")
        for key in body:
            if key not in _PROJECT_KEYS:
                raise SpecError(f"{where}: unknown key {str(key)[:60]!r}", hint=_near(str(key), _PROJECT_KEYS))
        quota = _gpus(body.get("gpu_quota"), f"{where}.gpu_quota", "write gpu_quota: 8, or leave it out for no cap")
        guaranteed = _gpus(body.get("guaranteed"), f"{where}.guaranteed",
                           "write guaranteed: 8 (GPUs it always gets back), or leave it out for none") or 0
        borrow = _gpus(body.get("borrow"), f"{where}.borrow",
                       "write borrow: 8 (GPUs past its guarantee while others are idle), or leave it out for no limit")
        if borrow is not None:
            if quota is not None:
                raise SpecError(f"{where}: gpu_quota and borrow both cap its GPUs (gpu_quota: {quota}, "
                                f"guaranteed + borrow: {guaranteed + borrow})",
                                hint="write guaranteed and borrow (the cap is their sum), or gpu_quota alone")
            quota = guaranteed + borrow
        if quota is not None and quota < guaranteed:
            raise SpecError(f"{where}: gpu_quota {quota} is below guaranteed {guaranteed}",
                            hint="a guarantee above the cap could never be used: raise gpu_quota or lower guaranteed")
        out[name] = Share(_weight(body.get("weight", default), f"{where}.weight"), quota, guaranteed, borrow)
    return FairShare(out, default, half_life)


def half_life_s(value: Any, where: str = "scheduler.half_life") -> float:
    """``7d``, ``12h``, ``90m``, ``3600s``, ``2w`` or a number of seconds -> seconds (> 0, at most 10 years)."""
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and len(value) <= 40:
        text = value.strip().lower()
        unit = _UNITS.get(text[-1:]) if text else None
        try:
            seconds = float(text[:-1]) * unit if unit else float(text)
        except ValueError:
            seconds = None
    if seconds is None or not math.isfinite(seconds) or not 0 < seconds <= MAX_HALF_LIFE:
        raise SpecError(f"{where} must be a time > 0 (at most 10 years), got {str(value)[:60]!r}",
                        hint="write half_life: 7d (past usage counts half after a week, as Slurm's "
                             "PriorityDecayHalfLife); units s, m, h, d, w, or a number of seconds")
    return seconds


def _gpus(value: Any, where: str, hint: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_QUOTA):
        raise SpecError(f"{where} must be a whole number of GPUs >= 0, got {str(value)[:60]!r}", hint=hint)
    return value


def check(fair: FairShare | None, fleet_gpus: int, project: str, priority: str, gpus: int, nodes: int) -> None:
    """Refuse at submit what quotas make impossible: quotas that add up to more GPUs than the
    fleet has, or a normal/critical job bigger than its project's quota."""
    if fair is None:
        return
    # (caps made of guaranteed + borrow may overlap: borrowing idle GPUs is what they are for)
    quotas = {name: s.quota for name, s in fair.projects.items() if s.quota is not None and s.borrow is None}
    total = sum(quotas.values())
    if fleet_gpus and total > fleet_gpus:
        listed = ", ".join(f"{n}: {q}" for n, q in list(quotas.items())[:8])
        raise CapacityError(f"the projects' gpu_quota in config.yaml add up to {total} GPUs but the fleet has "
                            f"{fleet_gpus} ({listed})",
                            hint="lower the gpu_quota values in config.yaml's scheduler.projects so they sum to at "
                                 "most the fleet (a quota is a guarantee's ceiling, not a reservation)")
    guaranteed = {name: s.guaranteed for name, s in fair.projects.items() if s.guaranteed}
    if fleet_gpus and sum(guaranteed.values()) > fleet_gpus:
        listed = ", ".join(f"{n}: {q}" for n, q in list(guaranteed.items())[:8])
        raise CapacityError(f"the projects' guaranteed GPUs in config.yaml add up to {sum(guaranteed.values())} but "
                            f"the fleet has {fleet_gpus} ({listed})",
                            hint="lower the guaranteed values in config.yaml's scheduler.projects so they sum to at "
                                 "most the fleet: a guarantee the fleet cannot honour for all at once is none")
    quota = fair.share(project).quota
    if priority != "best-effort" and quota is not None and gpus * nodes > quota:
        raise CapacityError(f"the job asks for {gpus * nodes} GPU(s) but project {project or '(default)'!r} has a "
                            f"gpu_quota of {quota}",
                            hint="ask for fewer GPUs, submit it as priority: best-effort (it may use idle GPUs "
                                 "past the quota and is preempted first), or raise the quota in config.yaml")


def _weight(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 < value <= MAX_WEIGHT:
        raise SpecError(f"{where} must be a number > 0 (at most {MAX_WEIGHT:g}), got {str(value)[:60]!r}",
                        hint="weights are relative shares: 1 for an even share, 2 for twice as much; to use only "
                             "idle GPUs submit priority: best-effort instead of a zero weight")
    return float(value)


def _near(word: str, choices: tuple[str, ...]) -> str:
    import difflib

    near = difflib.get_close_matches(word, choices, n=1)
    return (f"did you mean {near[0]!r}? " if near else "") + f"valid keys: {', '.join(choices)}"
