"""Fair share and quotas across projects: ``scheduler:`` in ``$AUTORESEARCH_HOME/config.yaml``.

    scheduler:
      default_weight: 1            # a project not listed below
      projects:
        vision: {weight: 2, gpu_quota: 16}
        nlp:    {weight: 1}

With the section present the pass orders each priority class by the projects' dominant
share over weight and holds a project's normal and critical work to its ``gpu_quota``
(``scheduler.schedule(fair=...)``; docs/scheduling.md). Without it: submit order,
no quotas. The file is read (and cached) by ``backends/profiles.py`` (``profiles.fair_share(home)``),
which never is imported here; this module turns its
section into a :class:`~autoresearch.engine.scheduler.FairShare` and checks quotas against the fleet.
"""

from __future__ import annotations

import math
from typing import Any

from autoresearch.engine.scheduler import FairShare, Share
from autoresearch.errors import CapacityError, SpecError, check_section

_KEYS = ("projects", "default_weight")
_PROJECT_KEYS = ("weight", "gpu_quota")
MAX_PROJECTS = 10_000
MAX_WEIGHT = 1e6
MAX_QUOTA = 1 << 31
EXAMPLE = "scheduler: {projects: {NAME: {weight: 2, gpu_quota: 16}}, default_weight: 1}"


def parse(raw: Any) -> FairShare | None:
    """The ``scheduler:`` section -> FairShare (None when empty); SpecError naming the bad key."""
    if raw is None:
        return None
    check_section(raw, "scheduler", _KEYS, EXAMPLE, _near)
    default = _weight(raw.get("default_weight", 1), "scheduler.default_weight")
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
        quota = body.get("gpu_quota")
        if quota is not None and (isinstance(quota, bool) or not isinstance(quota, int) or not 0 <= quota < MAX_QUOTA):
            raise SpecError(f"{where}.gpu_quota must be a whole number of GPUs >= 0, got {str(quota)[:60]!r}",
                            hint="write gpu_quota: 8, or leave it out for no cap")
        out[name] = Share(_weight(body.get("weight", default), f"{where}.weight"), quota)
    return FairShare(out, default)


def check(fair: FairShare | None, fleet_gpus: int, project: str, priority: str, gpus: int, nodes: int) -> None:
    """Refuse at submit what quotas make impossible: quotas that add up to more GPUs than the
    fleet has, or a normal/critical job bigger than its project's quota."""
    if fair is None:
        return
    quotas = {name: s.quota for name, s in fair.projects.items() if s.quota is not None}
    total = sum(quotas.values())
    if fleet_gpus and total > fleet_gpus:
        listed = ", ".join(f"{n}: {q}" for n, q in list(quotas.items())[:8])
        raise CapacityError(f"the projects' gpu_quota in config.yaml add up to {total} GPUs but the fleet has "
                            f"{fleet_gpus} ({listed})",
                            hint="lower the gpu_quota values in config.yaml's scheduler.projects so they sum to at "
                                 "most the fleet (a quota is a guarantee's ceiling, not a reservation)")
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
