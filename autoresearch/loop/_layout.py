"""Layout rules of the report's figures (:mod:`autoresearch.loop._plots`): colours a reader can
see on white, end labels that do not overlap, a legend that leaves the axes to the data. The
rules are pure functions, tested without drawing; the few helpers below them apply them to a
figure they are handed (matplotlib is imported by the figures' code, never at import here).

* **Contrast**: the colour ramp of the parallel coordinates is cut so its lightest end (the
  worst trial) keeps :data:`MIN_CONTRAST` against the white page (WCAG's 3:1 for graphics);
  optuna's full ``Blues`` ends at white, and the worst trial vanished.
* **Legend**: under the axes, in columns (:func:`legend_under`); beside them, long labels
  took half the figure.
* **End labels**: :func:`spread` moves the labels of curves that end at one step apart by at
  least a line of text, as little as it can (least squares), inside the axes; what does not fit
  is left out by :func:`keep_labels`, best trials first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIN_CONTRAST = 3.0  # WCAG 2.1 non-text contrast: graphical objects against their background
RAMP = ("viridis", 0.0, 0.55)  # colormap, its best end, its worst end: 15:1 down to 3.4:1 on white
LABEL_GAP = 1.2  # end labels' centres apart, in font heights
LABEL_SIZE = 7.0  # end labels' font size, in points


def luminance(rgb: Sequence[float]) -> float:
    """WCAG relative luminance of an sRGB colour (components 0..1)."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(float(c)) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: Sequence[float], b: Sequence[float] = (1.0, 1.0, 1.0)) -> float:
    """WCAG contrast ratio of two colours (1: none, 21: black on white); ``b`` defaults to white."""
    la, lb = luminance(a), luminance(b)
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def spread(ys: Sequence[float], gap: float, lo: float, hi: float) -> list[float]:
    """Positions for labels wanted at ``ys`` (one axis, e.g. display pixels): each pair at least
    ``gap`` apart, each inside [lo, hi], their order kept, moved as little as can be (the least
    squares fit: pool-adjacent-violators on ``y - i * gap``). ``len(ys) - 1`` gaps must fit in
    hi - lo (:func:`capacity`); otherwise the labels are packed from ``lo`` up."""
    n = len(ys)
    if n == 0:
        return []
    order = sorted(range(n), key=lambda i: ys[i])
    shifted = [float(ys[i]) - k * gap for k, i in enumerate(order)]
    blocks: list[list[float]] = []  # [mean, weight] of pooled runs, nondecreasing
    for v in shifted:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2), (m1, w1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    fitted = [m for m, w in blocks for _ in range(int(w))]
    placed = [q + k * gap for k, q in enumerate(fitted)]
    for k in range(n):  # inside the bounds, gaps kept: up from lo, then down from hi
        placed[k] = max(placed[k], lo + k * gap)
    for k in range(n - 1, -1, -1):
        placed[k] = min(placed[k], hi - (n - 1 - k) * gap)
    if (n - 1) * gap > hi - lo:
        placed = [lo + k * gap for k in range(n)]
    out = [0.0] * n
    for k, i in enumerate(order):
        out[i] = placed[k]
    return out


def capacity(gap: float, lo: float, hi: float) -> int:
    """How many labels ``gap`` apart fit in [lo, hi]."""
    return 0 if gap <= 0 or hi < lo else int((hi - lo) // gap) + 1


def keep_labels(ranks: Sequence[float], room: int) -> set[int]:
    """The indexes of the ``room`` labels to draw: the lowest ``ranks`` (the incumbent ranked
    first, then the best final values)."""
    return set(sorted(range(len(ranks)), key=lambda i: (ranks[i], i))[:max(room, 0)])


def area_share(inner: tuple[float, float, float, float], outer: tuple[float, float, float, float]) -> float:
    """The area of box ``inner`` (x0, y0, x1, y1) as a share of box ``outer``'s."""
    def area(box: tuple[float, float, float, float]) -> float:
        return max(box[2] - box[0], 0.0) * max(box[3] - box[1], 0.0)

    return area(inner) / area(outer) if area(outer) > 0 else float("inf")


# -- applied to a figure ---------------------------------------------------------------------


def legend_under(fig: Any, ax: Any) -> None:
    """Lay the figure out with its legend in columns under the axes, the whole width left to the
    data (beside the axes, long labels took half the figure); none when nothing has a label (an
    all-failed loop: matplotlib would warn "No artists with labels found to put in legend")."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        fig.tight_layout()
        return
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(3, len(handles)), 0, -1):  # fewer columns while a row is wider than the figure
        legend = fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), fontsize=8,
                            ncol=ncol, frameon=False, borderaxespad=0.3, columnspacing=1.5)
        if ncol == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.get_figwidth() * fig.dpi:
            break
        legend.remove()
    height = legend.get_window_extent(renderer).height / (fig.get_figheight() * fig.dpi)
    fig.tight_layout(rect=(0, min(height + 0.01, 0.5), 1, 1))


@dataclass
class End:
    """A curve's end label: its text, where the curve ends (data), colour, rank (lower first)."""

    text: str
    x: float
    y: float
    color: str
    rank: float


def end_labels(fig: Any, ax: Any, ends: list[End]) -> list[Any]:
    """Label each curve's end, the labels of curves that end near one x spread apart by
    :data:`LABEL_GAP` font heights (a thin line back to the end when
    moved); where more end there than the axes' height holds, the best are labelled and the
    rest are left to report.html's hover. Call it after the layout: it places in pixels, and it
    freezes the axes' limits. Returns the annotations."""
    ax.set_xlim(ax.get_xlim())
    ax.set_ylim(ax.get_ylim())
    box = ax.get_window_extent(fig.canvas.get_renderer())
    pt = fig.dpi / 72.0
    gap = LABEL_GAP * LABEL_SIZE * pt
    width = (2.4 * LABEL_SIZE + 3) * pt  # a label "#123" and its offset: ends nearer than this share a column
    placed = sorted(((*ax.transData.transform((e.x, e.y)), e) for e in ends), key=lambda p: p[0])
    columns: list[list[tuple[float, float, End]]] = []
    for p in placed:
        if columns and p[0] - columns[-1][0][0] < width:
            columns[-1].append(p)
        else:
            columns.append([p])
    low, high = box.y0 + gap / 2, box.y1 - gap / 2
    out = []
    for column in columns:
        keep = keep_labels([e.rank for _, _, e in column], capacity(gap, low, high))
        shown = [p for i, p in enumerate(column) if i in keep]
        for (_, y, e), at in zip(shown, spread([p[1] for p in shown], gap, low, high), strict=True):
            moved = (at - y) / pt
            out.append(ax.annotate(e.text, (e.x, e.y), xytext=(3, moved), textcoords="offset points",
                                   fontsize=LABEL_SIZE, color=e.color, va="center", annotation_clip=False,
                                   arrowprops=dict(arrowstyle="-", lw=0.4, color=e.color, shrinkA=0, shrinkB=0)
                                   if abs(moved) > LABEL_SIZE / 2 else None))
    return out


def recolour(ax: Any, sign: float) -> Any:
    """optuna's lines in :data:`RAMP`, best darkest, the worst still
    visible on white (optuna's ``Blues`` ends at white); its colour bar follows. The lines'
    collection, or None."""
    import matplotlib
    from matplotlib.colors import ListedColormap

    lines = next((c for c in ax.collections if c.get_array() is not None), None)
    if lines is None:
        return None
    name, best, worst = RAMP
    ends = (best, worst) if sign > 0 else (worst, best)  # low values darkest when lower is better
    ramp = matplotlib.colormaps[name]
    lines.set_cmap(ListedColormap([ramp(ends[0] + (ends[1] - ends[0]) * i / 255) for i in range(256)],
                                  name=f"{name}-cut"))
    lines.set_linewidth(1.3)
    return lines


def segment_of(lines: Any, value: float) -> int:
    """The index of the line drawn for the trial with objective ``value`` (optuna colours by it)."""
    values = list(lines.get_array())
    return min(range(len(values)), key=lambda i: abs(float(values[i]) - value))
