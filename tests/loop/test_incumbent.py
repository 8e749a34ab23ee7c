"""One source of truth for "best" (issue 13, item 1): the table, the plots, summary.md and the
MCP leaderboard show the incumbent the loop kept (noise-aware), never a lower single run that
the loop judged to be within the noise floor."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop import _plots
from autoresearch.loop.report import summary_with_plot, write_report
from autoresearch.loop.views import loop_view

# (role, parent, seed, state, objective, promoted?, margin) in the order they end, like the digits
# example: #1 is kept, its two seeds give a noise floor of 0.008 around a mean of 0.10, then #4
# scores 0.095 (lower than the incumbent's 0.10, but by less than the floor: not kept), #5 is
# early-stopped with a partial curve, #6 is worse.
TRIALS = [("explore", None, 0, "succeeded", 0.10, True, None),
          ("repeat", 1, 1, "succeeded", 0.092, None, None),
          ("repeat", 1, 2, "succeeded", 0.108, None, None),
          ("explore", None, 0, "succeeded", 0.095, False, 0.005),
          ("explore", None, 0, "stopped", None, None, None),
          ("explore", None, 0, "succeeded", 0.2, False, -0.1)]


def seed(api: Any, extra_failed: int = 0) -> None:
    plan = {"name": "noisy", "objective": {"metric": "loss", "goal": "minimize"}, "budget": {"trials": 30,
            "parallel": 2}, "repeats": {"seeds": 3}, "early_stop": {"kind": "asha", "min_steps": 2,
                                                                     "reduction_factor": 2},
            "space": {"lr": {"low": 1e-4, "high": 1.0, "log": True, "type": "float"},
                      "width": {"choices": [8, 16]}}}
    now = time.time() - 100
    with api._ledger.tx() as c:
        loop = c.execute("INSERT INTO loops(name, plan, state, experiment, created_at, updated_at) VALUES "
                         "('noisy', ?, 'finished', 'noisy', ?, ?)", (json.dumps(plan), now, now)).lastrowid
        rows = TRIALS + [("explore", None, 0, "failed", None, None, None)] * extra_failed
        for i, (role, parent, s, state, value, promoted, margin) in enumerate(rows, 1):
            params = {"lr": 10 ** -(1 + i % 3), "width": 8 if i % 2 else 16}
            job = c.execute("INSERT INTO jobs(name, spec, state, priority, gpus, nodes, backend, submitted_at, "
                            "updated_at) VALUES (?, '{}', ?, 'normal', 0, 1, 'local', ?, ?)",
                            (f"t{i}", "cancelled" if state == "stopped" else state, now, now)).lastrowid
            c.execute("INSERT INTO trials(loop_id, job_id, parent_trial, params, seed, proposer, state, objective, "
                      "role, created_at, updated_at, started_at, ended_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                      (loop, job, parent, json.dumps(params), s, "tpe", state, value, role, now, now, now + i,
                       now + i + 1))
            for step in range(4 if state == "stopped" else 8):  # the curve: ends at the objective
                point = (value or 0.5) + 0.05 * (8 - step)
                c.execute("INSERT INTO metrics(job_id, attempt, name, step, value, ts, source) VALUES "
                          "(?, 1, 'loss', ?, ?, ?, 'report')", (job, step, point, now + i + step / 10))
            if promoted is not None:
                c.execute("INSERT INTO decisions(loop_id, kind, outputs, created_at, trial_id) VALUES "
                          "(?, 'promote', ?, ?, ?)", (loop, json.dumps({"promoted": promoted, "trial_id": i,
                                                                        "margin": margin}), now + i + 1.5, i))


def test_best_so_far_is_the_incumbent_not_a_lower_run_within_noise(api: Any) -> None:
    seed(api)
    view = loop_view(api._ledger, "noisy")
    by_id = {t.trial_id: t for t in view.trials}
    assert view.best_trial == 1 and view.best_value == pytest.approx(0.10)
    assert by_id[4].within_noise and not by_id[4].kept and by_id[1].kept
    # after #4 ended, "best so far" is still the incumbent's mean, not #4's 0.095
    assert by_id[4].best_so_far == pytest.approx(0.10)
    assert [c.incumbent for c in view.curve] == [1, 1, 1, 1, 1, 1]
    assert view.curve[-1].value == pytest.approx(view.best_value)


def test_summary_and_mcp_leaderboard_put_the_incumbent_first_and_mark_noise(api: Any, tmp_path: Path) -> None:
    seed(api)
    write_report(api._ledger, "noisy", tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert "**Best:** trial 1 (job 1: `autoresearch logs T1`): `loss` = 0.1 (mean of 3 seeds)" in summary
    board = [line for line in summary.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert board[0].startswith("| 1 | 1 | explore") and "incumbent" in board[0]
    assert any(line.startswith("| 4 |") and "within noise" in line for line in board)
    assert "trial 4 (0.095)" in summary  # named as a lower run within noise, not kept
    _, rows = api.leaderboard("noisy")
    assert rows[0]["trial_id"] == 1 and rows[0]["verdict"] == "incumbent"
    assert {r["trial_id"]: r["verdict"] for r in rows}[4] == "within noise"


def test_plots_draw_the_incumbent_every_trial_and_partial_curves(api: Any, tmp_path: Path) -> None:
    seed(api)
    view = write_report(api._ledger, "noisy", tmp_path)
    data = _plots.load(api._ledger, view, json.loads(api._ledger.one("SELECT plan FROM loops")["plan"]))
    fig = _plots.plot_best_vs_trials(data)
    ax = fig.axes[0]
    best = next(line for line in ax.lines if "best so far" in str(line.get_label()))
    # the kept incumbent's mean over its seeds as they came in, never #4's 0.095
    assert list(best.get_ydata()) == pytest.approx([0.1, 0.096, 0.1, 0.1, 0.1, 0.1])
    labels = {str(c.get_label()) for c in ax.collections}
    assert {"finished trial", "seed repeat", "early-stopped (last value)", "gain within noise: not kept"} <= labels
    drawn = sum(len(c.get_offsets()) for c in ax.collections
                if c.get_label() in ("finished trial", "seed repeat", "early-stopped (last value)"))
    assert drawn == 6  # every ended trial, the early-stopped one at its last value
    _plots.close(fig)
    curves = _plots.plot_learning_curves(data)
    assert any(line.get_label() == "ASHA rung" for line in curves.axes[0].lines)
    assert len(curves.axes[0].lines[0].get_xdata()) == 8
    _plots.close(curves)
    assert _plots.asha_rungs(data.plan, 7) == [2, 4]
    for name in ("best_vs_trials", "best_vs_time", "learning_curves", "parallel"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
    page = (tmp_path / "report.html").read_text()
    assert 'id=\'trial-4\'' in page and "<title>trial 4 (explore, succeeded, within noise)" in page


def test_parallel_coordinates_have_real_log_axes_and_a_colour_bar(api: Any) -> None:
    seed(api)
    view = loop_view(api._ledger, "noisy")
    data = _plots.load(api._ledger, view, json.loads(api._ledger.one("SELECT plan FROM loops")["plan"]))
    fig = _plots.plot_parallel(data)
    scales = {ax.get_yscale() for ax in fig.axes}
    assert "log" in scales  # lr is log: true in the space
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    _plots.close(fig)


def test_summary_with_plot_writes_where_asked(api: Any, tmp_path: Path) -> None:
    seed(api)
    text, path = summary_with_plot(api._ledger, "noisy", tmp_path / "ci" / "best.png")
    assert path is not None and path.stat().st_size > 10_000 and "**Best:** trial 1" in text
    text, where = api.loop_summary("noisy", str(tmp_path / "facade.png"))  # the same, through the facade
    assert where == str(tmp_path / "facade.png") and Path(where).stat().st_size > 10_000 and "trial 1" in text


def test_live_table_agrees_and_says_how_many_rows_it_left_out(api: Any) -> None:
    from rich.console import Console

    from autoresearch.cli._live import ROWS, LiveTable

    seed(api, extra_failed=ROWS)
    view = loop_view(api._ledger, "noisy")

    class Plan:
        name = "noisy"

    table = LiveTable(Plan(), interactive=True)
    table.console = Console(file=io.StringIO(), width=250)
    table.console.print(table._table(view))
    out = table.console.file.getvalue()
    hidden = len(view.trials) - ROWS
    assert f"{hidden} more trial(s) not shown" in out
    assert "1 *" in out  # the incumbent is kept on screen and marked, though older than the rows shown
    assert "0.095" not in out.split("BEST SO FAR")[1].replace("0.095 ", "")  # never a best-so-far value


def test_a_report_survives_markup_and_math_in_names(api: Any, tmp_path: Path) -> None:
    seed(api)
    with api._ledger.tx() as c:  # a metric name matplotlib would read as math, params with markup
        plan = json.loads(c.execute("SELECT plan FROM loops").fetchone()[0])
        plan["objective"]["metric"] = "loss$_{x"
        c.execute("UPDATE loops SET plan=?", (json.dumps(plan),))
        c.execute("UPDATE metrics SET name='loss$_{x'")
        c.execute("""UPDATE trials SET params='{"lr": 0.01, "<b>w$": "<script>"}' WHERE id=6""")
    write_report(api._ledger, "noisy", tmp_path)
    assert {"best_vs_trials.png", "best_vs_time.png", "learning_curves.png"} <= {p.name for p in tmp_path.iterdir()}
    page = (tmp_path / "report.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_the_best_is_chosen_on_means_once_repeats_exist() -> None:
    """The README's example: trial 13 (mean of 3 seeds 0.07541) was the incumbent, trial 14 was kept on
    one lucky run (0.0731) and its seeds then gave a mean of 0.07695; the loop kept trial 14 anyway.
    Now the earlier incumbent, better on means, takes its place back."""
    from autoresearch.loop.views import Verdict, incumbent_sequence

    def row(i: int, role: str, parent: int | None, value: float) -> dict[str, Any]:
        return {"id": i, "role": role, "parent_trial": parent, "state": "succeeded", "objective": value,
                "ended_at": float(i)}

    rows = [row(13, "explore", None, 0.0750), row(15, "repeat", 13, 0.0757), row(16, "repeat", 13, 0.07553),
            row(14, "explore", None, 0.0731), row(17, "repeat", 14, 0.0790), row(18, "repeat", 14, 0.07875)]
    order = {13: 1.0, 15: 2.0, 16: 3.0, 14: 4.0, 17: 5.0, 18: 6.0}
    rows = [{**r, "ended_at": order[r["id"]]} for r in rows]
    judged = {13: Verdict(13, True, False, 1.0, 1), 14: Verdict(14, True, False, 4.0, 2)}
    steps = incumbent_sequence(rows, judged)
    assert [s.incumbent for s in steps] == [13, 13, 13, 14, 13, 13]  # 14 kept on one run; two seeds undo it
    assert steps[-1].value == pytest.approx((0.0750 + 0.0757 + 0.07553) / 3)


def test_the_best_says_whether_its_seeds_confirmed_it(api: Any) -> None:
    """A best whose repeats have not all ended (the budget ended first) was called best like any other."""
    from autoresearch.loop.report import summary_markdown
    from autoresearch.loop.views import LoopView, confirmed, confirmed_text

    seed(api)
    view = loop_view(api._ledger, "noisy")
    assert view.best_trial == 1 and view.best_confirmed is True  # itself and its two repeats ended
    assert "· **confirmed (3 seeds)**" in summary_markdown(view, {"repeats": {"seeds": 3}}, [])
    assert confirmed(1, {"repeats": {"seeds": 3}}) is False and confirmed(3, {}) is None
    alone = LoopView("x", 1, "finished", "loss", "minimize", [], {}, 4, 0.1, best_seeds=1, best_confirmed=False)
    assert confirmed_text(alone, {"repeats": {"seeds": 3}}) == "not confirmed: 1 of 3 seed(s) ended"
    assert "**not confirmed: 1 of 3 seed(s) ended**" in summary_markdown(alone, {"repeats": {"seeds": 3}}, [])


def test_plots_and_the_ci_gate_say_whether_the_best_is_confirmed(api: Any, tmp_path: Path) -> None:
    """The summary said "confirmed" or not; the plots, the gate's verdict, the JUnit file and the
    Markdown summary called a best on one of its three seeds best like any other."""
    import xml.etree.ElementTree as ET

    from autoresearch.loop import ci_report
    from autoresearch.loop.gate import Baseline, baseline_from_summary, evaluate
    from autoresearch.loop.plan import Gate

    seed(api)
    with api._ledger.tx() as c:  # the third seed of the incumbent has not ended: 2 of 3
        c.execute("UPDATE trials SET state='running', objective=NULL, ended_at=NULL WHERE id=3")
    view = loop_view(api._ledger, "noisy")
    assert view.best_trial == 1 and view.best_confirmed is False and view.best_seeds == 2
    data = _plots.load(api._ledger, view, json.loads(api._ledger.one("SELECT plan FROM loops")["plan"]))
    note = "not confirmed: 2 of 3 seed(s) ended"
    fig = _plots.plot_best_vs_trials(data)
    ax = fig.axes[0]
    assert any(note in str(line.get_label()) for line in ax.lines)  # the best-so-far line
    assert any(f"incumbent: trial 1 (one run), {note}" == c.get_label() for c in ax.collections)  # the star
    assert note in ax.get_title()
    _plots.close(fig)
    fig = _plots.plot_learning_curves(data)
    assert any(f"incumbent: trial 1, {note}" == line.get_label() for line in fig.axes[0].lines)
    _plots.close(fig)

    result = evaluate(view, Gate(metric="loss", max_regression=0.5), Baseline("b.json", "json", "loss", 0.2))
    assert result.verdict == "pass" and result.candidate_confirmed is False
    assert "[not confirmed (2 seeds ended)]" in result.rationale
    props = {p.get("name"): p.get("value") for p in ET.fromstring(ci_report.junit(view, result, {})).iter("property")}
    assert props["best_confirmed"] == "false" and props["best_seeds"] == "2"
    assert "not confirmed" in ci_report.markdown(view, result, 0, "pass")
    summary = ci_report.summary(view, result, 0, "pass", {})
    assert summary["best"]["confirmed"] is False and summary["gate"]["candidate_confirmed"] is False
    (tmp_path / "base.json").write_text(json.dumps(summary, default=str))
    base = baseline_from_summary(tmp_path / "base.json", "loss", "minimize")  # the next night's baseline says so
    assert base.confirmed is False
    again = evaluate(view, Gate(metric="loss", max_regression=0.5), base)
    assert "vs baseline 0.096 [not confirmed]: equal" in again.rationale

    with api._ledger.tx() as c:  # its seed ends: confirmed everywhere
        c.execute("UPDATE trials SET state='succeeded', objective=0.108, ended_at=? WHERE id=3", (time.time(),))
    view = loop_view(api._ledger, "noisy")
    data = _plots.load(api._ledger, view, json.loads(api._ledger.one("SELECT plan FROM loops")["plan"]))
    fig = _plots.plot_best_vs_trials(data)
    assert "confirmed (3 seeds)" in fig.axes[0].get_title() and "not confirmed" not in fig.axes[0].get_title()
    _plots.close(fig)
    result = evaluate(view, Gate(metric="loss", max_regression=0.5), Baseline("b.json", "json", "loss", 0.2))
    assert "[confirmed (3 seeds)]" in result.rationale
    props = {p.get("name"): p.get("value") for p in ET.fromstring(ci_report.junit(view, result, {})).iter("property")}
    assert props["best_confirmed"] == "true"


def test_the_sequence_runs_on_the_trials_clock_not_the_decisions() -> None:
    """On the sim backend trials end in simulated time and decisions are stamped with the wall
    clock: the sequence (and the best-vs-time x axis) follows the trials' ends alone."""
    from autoresearch.loop.views import Verdict, incumbent_sequence

    wall, sim = 1_000.0, 50_000.0  # the sim's stamps run far ahead of the wall clock

    def trial(i: int, ended: float, value: float | None, state: str = "succeeded") -> dict[str, Any]:
        return {"id": i, "ended_at": ended, "state": state, "objective": value, "role": "explore", "parent_trial": None}

    rows = [trial(1, sim + 100, 0.5), trial(2, sim + 50, None, "failed"), trial(3, sim + 200, 0.4)]
    judged = {1: Verdict(1, True, False, wall + 1, 10), 3: Verdict(3, True, False, wall + 2, 11)}
    curve = incumbent_sequence(rows, judged)
    assert [(c.trial_id, c.at, c.incumbent) for c in curve] == [(2, sim + 50, None), (1, sim + 100, 1),
                                                                 (3, sim + 200, 3)]
    # a batch judged out of end order: each step at the latest end judged so far
    judged = {1: Verdict(1, True, False, wall + 1, 12), 3: Verdict(3, True, False, wall + 2, 11)}
    assert [(c.trial_id, c.at) for c in incumbent_sequence(rows, judged)] == [(2, sim + 50), (3, sim + 200),
                                                                               (1, sim + 200)]
