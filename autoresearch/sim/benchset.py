"""The search benchmark's development / test split (``data/split.json``): which recorded workloads
and which seeds may be used to choose a default, and which only to report one.

The rule (in the file, and in docs/search-benchmark.md): defaults are chosen on the development
workloads and development seeds only; the test set is reported. :func:`check_tuning` is the
guard every tuning helper calls first: a test workload or a test seed is a
:class:`~autoresearch.errors.SpecError`, so a default cannot be chosen on the workloads it is
reported on. Stdlib only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autoresearch.errors import SpecError

DATA = Path(__file__).resolve().parent / "data"
SPLIT = DATA / "split.json"
FORMAT = "autoresearch-benchmark-split/1"
_HINT = "the split is autoresearch/sim/data/split.json (docs/search-benchmark.md)"


@dataclass(frozen=True)
class Part:
    """One side of the split: its workloads and its seeds ``range(seeds[0], seeds[1])``."""

    workloads: tuple[str, ...]
    seeds: range


@dataclass(frozen=True)
class Split:
    dev: Part
    test: Part
    rule: str

    def part(self, name: str) -> Part:
        if name not in ("dev", "test"):
            raise SpecError(f"no benchmark set {str(name)[:20]!r}", hint="dev or test")
        return self.dev if name == "dev" else self.test

    def paths(self, name: str) -> list[Path]:
        return [DATA / f"{w}.json.gz" for w in self.part(name).workloads]


def _part(raw: object, name: str) -> Part:
    if not isinstance(raw, dict):
        raise SpecError(f"split.json: {name} is missing", hint=_HINT)
    workloads, seeds = raw.get("workloads"), raw.get("seeds")
    if not isinstance(workloads, list) or not workloads or not all(isinstance(w, str) and w for w in workloads):
        raise SpecError(f"split.json: {name}.workloads is not a list of names", hint=_HINT)
    if (not isinstance(seeds, list) or len(seeds) != 2 or not all(type(s) is int for s in seeds)
            or not 0 <= seeds[0] < seeds[1]):
        raise SpecError(f"split.json: {name}.seeds is not [first, end)", hint=_HINT)
    return Part(tuple(workloads), range(seeds[0], seeds[1]))


def load_split(path: Path = SPLIT) -> Split:
    """The split; overlapping workloads or seeds between dev and test are refused."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise SpecError(f"cannot read the benchmark split: {str(err)[:120]}", hint=_HINT) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise SpecError(f"split.json: format is not {FORMAT!r}", hint=_HINT)
    dev, test = _part(raw.get("dev"), "dev"), _part(raw.get("test"), "test")
    both = sorted(set(dev.workloads) & set(test.workloads))
    if both:
        raise SpecError(f"split.json: {', '.join(both)[:100]} in both dev and test", hint=_HINT)
    if dev.seeds.start < test.seeds.stop and test.seeds.start < dev.seeds.stop:
        raise SpecError("split.json: dev and test seeds overlap", hint=_HINT)
    return Split(dev, test, str(raw.get("rule", ""))[:2000])


def check_tuning(workloads: Iterable[str], seeds: Iterable[int], split: Split | None = None) -> None:
    """Refuse to choose a default on anything but development workloads and seeds."""
    split = split or load_split()
    workloads, seeds = list(workloads), list(seeds)
    if not workloads or not seeds:
        raise SpecError("tuning needs at least one workload and one seed", hint=f"dev: {', '.join(split.dev.workloads)}")
    test = [w for w in workloads if w in split.test.workloads]
    if test:
        raise SpecError(f"{', '.join(test)[:100]} is a test workload: defaults are chosen on dev workloads only",
                        hint=f"dev workloads: {', '.join(split.dev.workloads)}; {split.rule[:200]}")
    unknown = [w for w in workloads if w not in split.dev.workloads]
    if unknown:
        raise SpecError(f"{', '.join(unknown)[:100]} is in neither set of the split",
                        hint="a new workload joins the test set first; " + _HINT)
    outside = [s for s in seeds if s not in split.dev.seeds]
    if outside:
        raise SpecError(f"seed(s) {', '.join(map(str, outside[:5]))} are not development seeds",
                        hint=f"dev seeds are {split.dev.seeds.start}..{split.dev.seeds.stop - 1}")
