"""The report's figures read well: the worst trial stays visible, curve labels do not overlap,
the legend leaves the axes to the data, a best line never goes back in time, and each plot
names the best trial as summary.md does (number, job, confirmed over seeds)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import matplotlib
import pytest
from matplotlib.text import Text

from autoresearch.loop import _layout as L
from autoresearch.loop import _plots
from autoresearch.loop.report import summary_markdown
from autoresearch.loop.views import confirmed_text, loop_view
from tests.loop.test_incumbent import seed

matplotlib.use("Agg")


def _data(api: Any) -> _plots.ReportData:
    view = loop_view(api._ledger, "noisy")
    return _plots.load(api._ledger, view, json.loads(api._ledger.one("SELECT plan FROM loops")["plan"]))


# -- the pure rules -------------------------------------------------------------------------


def test_spread_keeps_a_gap_the_order_and_the_bounds_moving_as_little_as_it_can() -> None:
    ys = [100.0, 101.0, 100.5, 300.0, 99.0, 5.0]
    placed = L.spread(ys, 12.0, 0.0, 400.0)
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    assert [placed[i] for i in order] == sorted(placed)  # the order is kept
    ranked = sorted(placed)
    assert all(b - a >= 12.0 - 1e-9 for a, b in zip(ranked, ranked[1:], strict=False))
    assert min(placed) >= 0.0 and max(placed) <= 400.0
    assert placed[3] == 300.0 and placed[5] == 5.0  # labels with room stay where their curve ends
    cluster = [placed[i] for i in (0, 1, 2, 4)]  # four close labels: centred where they were wanted
    assert sum(cluster) / 4 == pytest.approx((100 + 101 + 100.5 + 99) / 4)


def test_spread_pushes_labels_inside_the_axes_and_packs_what_cannot_fit() -> None:
    assert L.spread([0.0, 0.0, 0.0], 10.0, 0.0, 100.0) == [0.0, 10.0, 20.0]
    assert L.spread([100.0, 100.0], 10.0, 0.0, 100.0) == [90.0, 100.0]
    assert L.spread([], 10.0, 0.0, 100.0) == []
    assert L.capacity(10.0, 0.0, 100.0) == 11 and L.capacity(10.0, 5.0, 0.0) == 0
    assert L.keep_labels([3.0, -1.0, 2.0, 0.5], 2) == {1, 3}  # the incumbent (ranked first), then the best


def test_the_colour_ramp_stays_visible_on_white_at_both_ends() -> None:
    ramp = matplotlib.colormaps[L.RAMP[0]]
    for end in L.RAMP[1:]:
        assert L.contrast(ramp(end)) >= L.MIN_CONTRAST
    assert L.contrast(matplotlib.colormaps["Blues"](0.0)) < 1.2  # optuna's ramp: its end is white
    assert L.contrast((0, 0, 0)) == pytest.approx(21.0)


# -- the figures ----------------------------------------------------------------------------


def test_parallel_draws_the_worst_trial_visibly_and_the_incumbent_in_red(api: Any) -> None:
    seed(api)
    data = _data(api)
    fig = _plots.plot_parallel(data)
    ax = fig.axes[0]
    lines = next(c for c in ax.collections if c.get_array() is not None)
    values = [float(v) for v in lines.get_array()]
    worst, best = lines.to_rgba(max(values)), lines.to_rgba(min(values))  # minimize: the highest is worst
    assert L.contrast(worst) >= L.MIN_CONTRAST
    assert L.contrast(best) > L.contrast(worst)  # darker is better
    assert any(line.get_color() == "C3" for line in ax.lines)  # the incumbent on top
    title = fig._suptitle.get_text()
    assert "trial 1 (job 1)" in title and confirmed_text(data.view, data.plan) in title
    _plots.close(fig)


def test_learning_curve_end_labels_are_a_font_height_apart(api: Any) -> None:
    seed(api)
    data = _data(api)
    for trial in data.series:  # every curve ends at step 7, within 0.001 of the others
        data.series[trial] = [(s, 0.3 + 0.05 * (8 - s) + trial * 1e-4, 0.0) for s in range(8)]
    fig = _plots.plot_learning_curves(data)
    ax = fig.axes[0]
    fig.canvas.draw()
    labels = [t for t in ax.texts if t.get_text().startswith("#")]
    assert len(labels) == len(data.series)
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the text's own box, without its line
    centres = sorted((b.y0 + b.y1) / 2 for b in boxes)
    height = labels[0].get_fontsize() * fig.dpi / 72  # a font height, in pixels
    assert min(b - a for a, b in zip(centres, centres[1:], strict=False)) >= height
    box = ax.get_window_extent(renderer)
    assert box.y0 <= centres[0] and centres[-1] <= box.y1
    _plots.close(fig)


def test_more_ends_than_the_axes_hold_label_the_best_and_the_incumbent(api: Any) -> None:
    seed(api)
    data = _data(api)
    curve = data.series[1]
    for trial in range(100, 400):  # 300 trials ending at one point
        data.series[trial] = [(s, v + trial * 1e-5, ts) for s, v, ts in curve]
    model = next(t for t in data.view.trials if t.trial_id == 6)  # a finished explore trial, not the best
    data.view.trials += [dataclasses.replace(model, trial_id=i) for i in range(100, 400)]
    fig = _plots.plot_learning_curves(data)
    ax = fig.axes[0]
    shown = {t.get_text() for t in ax.texts}
    assert "#1" in shown  # the incumbent
    assert len(shown) < len(data.series)
    _plots.close(fig)


def test_the_legend_is_under_the_axes_and_small(api: Any) -> None:
    seed(api)
    data = _data(api)
    for make in (_plots.plot_best_vs_trials, _plots.plot_best_vs_time, _plots.plot_learning_curves):
        fig = make(data)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box = fig.axes[0].get_window_extent(renderer)
        legend = (fig.legends or [fig.axes[0].get_legend()])[0].get_window_extent(renderer)
        assert L.area_share((legend.x0, legend.y0, legend.x1, legend.y1), (box.x0, box.y0, box.x1, box.y1)) < 0.25
        assert legend.y1 <= box.y0  # below the axes, over none of the data
        assert legend.x0 >= 0 and legend.x1 <= fig.bbox.width  # inside the figure
        _plots.close(fig)


def test_every_plot_names_the_best_as_the_summary_does(api: Any) -> None:
    seed(api)
    data = _data(api)
    view = data.view
    summary = summary_markdown(view, data.plan, [])
    status = confirmed_text(data.view, data.plan)
    assert status and f"**{status}**" in summary and "**Best:** trial 1 (job 1" in summary
    for make in (_plots.plot_best_vs_trials, _plots.plot_best_vs_time, _plots.plot_learning_curves):
        fig = make(data)
        title = fig.axes[0].get_title()
        assert f"best: trial {view.best_trial} (job 1): loss = 0.1 (mean of 3 seeds), {status}" in title
        _plots.close(fig)


def test_the_best_line_against_time_never_goes_back(api: Any) -> None:
    """A trial judged first may end after trials judged later (one pass judges a batch of endings):
    the best-so-far line starts once it could be known, on the trials' own clock."""
    seed(api)
    with api._ledger.tx() as c:  # trial 1 (and its repeats) end after trial 4, judged after it
        c.execute("UPDATE trials SET ended_at = ended_at + 50 WHERE id IN (1, 2, 3)")
    data = _data(api)
    ats = [c.at for c in data.view.curve]
    assert [c.trial_id for c in data.view.curve if c.trial_id in (1, 4)] == [1, 4] and ats == sorted(ats)
    fig = _plots.plot_best_vs_time(data)
    best = next(line for line in fig.axes[0].lines if "best so far" in str(line.get_label()))
    xs = list(best.get_xdata())
    assert xs == sorted(xs) and xs[0] >= data.view.curve[0].at - data.start
    _plots.close(fig)


@pytest.mark.slow  # scikit-learn's import and the fANOVA fit: seconds
def test_the_importances_plot_has_no_legend_repeating_its_title(api: Any) -> None:
    seed(api)
    fig = _plots.plot_importances(_data(api))
    if fig is None:
        pytest.skip("scikit-learn is not installed: no importances")
    assert fig.axes[0].get_legend() is None  # optuna's named the one bar series after the metric
    _plots.close(fig)
