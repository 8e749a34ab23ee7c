"""docs/search-benchmark.png's layout: one legend, under the panels, naming each strategy once;
no panel carries a legend of strategies it does not draw."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("matplotlib")


def _run(workload: str, strategy: str, seed: int) -> dict[str, Any]:
    grid = [10.0 * i for i in range(1, 11)]
    return {"workload": workload, "strategy": strategy, "seed": seed, "grid": grid,
            "anytime": [1.0 / (i + seed + 1) for i in range(len(grid))]}


def test_the_benchmark_figure_has_one_legend_under_its_panels() -> None:
    from bench.bench_search import figure

    strategies = ["bohb+hyperband", "optuna:tpe+hb", "dehb", "synetune:bohb"]
    results = [_run(w, s, seed) for seed in (0, 1) for w, s in
               [("cancer-mlp", "bohb+hyperband"), ("cancer-mlp", "optuna:tpe+hb"), ("cancer-mlp", "dehb"),
                ("digits-linear", "bohb+hyperband"), ("digits-linear", "synetune:bohb")]]
    fig = figure(results, strategies, 0.05)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["cancer-mlp", "digits-linear"]
    assert all(ax.get_legend() is None for ax in fig.axes)  # no panel lists another panel's strategies
    assert len(fig.legends) == 1
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert names == ["bohb+hyperband", "optuna:tpe+hb (cancer-mlp only)", "dehb (cancer-mlp only)",
                     "synetune:bohb (digits-linear only)", "target (top 5%)"]  # each once, where it is drawn
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert all(legend.y1 <= ax.get_tightbbox(renderer).y0 for ax in panels)  # under the panels, over no curve
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_a_legend_of_long_labels_keeps_inside_the_figure() -> None:
    """Three columns of long labels were wider than the figure (the README example's incumbent and
    best-so-far entries were cut at both edges): columns are dropped until a row fits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autoresearch.loop._layout import legend_under

    fig, ax = plt.subplots(figsize=(10.5, 4.8), dpi=110)
    for i, label in enumerate(["finished trial", "early-stopped (last value)", "seed repeat",
                               "incumbent: trial 21 (one run), not confirmed: 1 of 3 seed(s) ended",
                               "best so far (the incumbent the loop kept, not confirmed: 1 of 3 seed(s) ended)",
                               "± noise floor (one run's std, now ±0.00785)"]):
        ax.plot([0, 1], [i, i + 1], label=label)
    legend_under(fig, ax)
    box = fig.legends[0].get_window_extent(fig.canvas.get_renderer())
    width = fig.get_figwidth() * fig.dpi
    assert len(fig.legends) == 1 and box.x0 >= 0 and box.x1 <= width, (box, width)
    plt.close(fig)
