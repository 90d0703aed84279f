"""Text a reader cannot read: `text_overlaps(fig)` draws the figure once and returns one line per problem.

Boxes are window extents in pixels; two "overlap" when they share more than `min_px` pixels in both directions
(texts that merely touch pass). Checked: every pair of drawn texts (a legend's own texts excepted); a legend's
frame against texts outside it and against data (line vertices, error-bar ends, scatter markers); a marker drawn
above a text; a text clipped by its panel, or written in a panel and running past its top or bottom edge.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

MIN_PX = 1.0  # overlap in both directions, in pixels, that counts


def _tick_labels(fig) -> tuple[set[int], list[Text]]:
    """(ids of every tick label of `fig`, the tick labels actually drawn): an axis draws only the ticks
    inside its view interval, and none when its panel is switched off (axis("off"))."""
    every, drawn = set(), []
    for ax in fig.axes:
        for axis in ax._axis_map.values():
            for tick in [*axis.majorTicks, *axis.minorTicks]:
                every.update((id(tick.label1), id(tick.label2)))
            if ax.axison and axis.get_visible():
                for tick in axis._update_ticks():  # the ticks inside the view interval, as Axis.draw draws them
                    drawn += [t for t in (tick.label1, tick.label2) if tick.get_visible() and t.get_visible()]
    return every, drawn


def _corners(t: Text, box: Bbox, renderer) -> np.ndarray:
    """The 4 pixel corners [4, 2] of `t`'s own rectangle: its box when level; when rotated, its level box
    turned by the angle about the centre of `box` (the axis-aligned box around it), so that slanted tick
    labels side by side do not count as overlapping where only their enclosing boxes meet."""
    angle = t.get_rotation() % 180
    if angle == 0:
        return np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])
    t.set_rotation(0)
    try:
        level = t.get_window_extent(renderer)
    finally:
        t.set_rotation(angle)
    w, h, a = level.width / 2, level.height / 2, np.deg2rad(angle)
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    return np.array([[-w, -h], [w, -h], [w, h], [-w, h]]) @ rot.T + [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2]


def _polygons_overlap(a: np.ndarray, b: np.ndarray, min_px: float) -> bool:
    """Two convex polygons [n, 2] overlap by more than `min_px` along every separating axis (their edges'
    normals)."""
    for poly in (a, b):
        edges = np.roll(poly, -1, axis=0) - poly
        for nx, ny in np.c_[-edges[:, 1], edges[:, 0]]:
            n = np.array([nx, ny]) / (np.hypot(nx, ny) or 1.0)
            pa, pb = a @ n, b @ n
            if min(pa.max(), pb.max()) - max(pa.min(), pb.min()) <= min_px:
                return False
    return True


def _texts(fig, renderer) -> list[tuple[Text, Bbox]]:
    """Every drawn, non-empty text artist of `fig` with its pixel box."""
    ticks, drawn = _tick_labels(fig)
    out, seen = [], set()
    for t in [*(t for t in fig.findobj(Text) if id(t) not in ticks), *drawn]:
        if id(t) in seen or not t.get_visible() or not t.get_text().strip():
            continue
        seen.add(id(t))
        if t.axes is not None and (not t.axes.get_visible() or not t.axes.axison
                                   and t in (t.axes.xaxis.label, t.axes.yaxis.label)):
            continue  # in a hidden panel, or an axis label of one switched off
        box = t.get_window_extent(renderer)
        if box.width > 0 and box.height > 0:
            out.append((t, box))
    return out


def _name(t: Text) -> str:
    text = " ".join(t.get_text().split())
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _overlap(a: Bbox, b: Bbox, min_px: float) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > min_px and min(a.y1, b.y1) - max(a.y0, b.y0) > min_px


def _legend_of(t: Text, legends: list[Legend]) -> Legend | None:
    return next((lg for lg in legends if t in lg.get_texts() or t is lg.get_title()), None)


def _data_points(ax) -> list[tuple[object, np.ndarray]]:
    """(artist, pixel points [n, 2]) of the data drawn in `ax`: lines' vertices, error bars' segment ends,
    scatter markers' centres."""
    out = []
    for line in ax.get_lines():
        if line.get_visible():
            xy = line.get_xydata()
            if len(xy) and not _is_reference_line(line):
                out.append((line, line.get_transform().transform(xy)))
    for c in ax.collections:
        if not c.get_visible():
            continue
        if isinstance(c, LineCollection):
            segs = [np.asarray(s) for s in c.get_segments() if len(s)]
            if segs:
                out.append((c, c.get_transform().transform(np.concatenate(segs))))
        elif isinstance(c, PathCollection):
            offsets = np.asarray(c.get_offsets())
            if len(offsets):
                out.append((c, c.get_offset_transform().transform(offsets)))
    return out


def _is_reference_line(line: Line2D) -> bool:
    """A line spanning the axes (axhline / axvline: a reference, drawn under legends by design)."""
    x, y = np.asarray(line.get_xdata(), dtype=object), np.asarray(line.get_ydata(), dtype=object)
    trans = line.get_transform()
    return len(x) == 2 and (trans.contains_branch(line.axes.get_yaxis_transform())
                            or trans.contains_branch(line.axes.get_xaxis_transform())) and (
        (list(x) == [0, 1]) or (list(y) == [0, 1]))


def text_overlaps(fig, min_px: float = MIN_PX) -> list[str]:
    """One line per text a reader cannot read in `fig` (see the module docstring); [] when clean."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = _texts(fig, renderer)
    legends = [lg for lg in fig.findobj(Legend) if lg.get_visible()]
    problems = []
    corners = {id(t): _corners(t, box, renderer) for t, box in texts}
    for (a, ba), (b, bb) in combinations(texts, 2):
        la, lb = _legend_of(a, legends), _legend_of(b, legends)
        if la is not None and la is lb:
            continue
        if _overlap(ba, bb, min_px) and _polygons_overlap(corners[id(a)], corners[id(b)], min_px):
            problems.append(f"text {_name(a)} overlaps text {_name(b)}")
    for lg in legends:
        frame = lg.get_window_extent(renderer)
        legend = f"legend ({_name(lg.get_texts()[0]) if lg.get_texts() else 'empty'}...) covers"
        problems += [f"{legend} text {_name(t)}" for t, box in texts
                     if _legend_of(t, legends) is None and _overlap(frame, box, min_px)]
        ax = lg.axes if lg.axes is not None and lg in lg.axes.get_children() else None
        for axes in ([ax] if ax is not None else fig.axes):
            inner = frame.padded(-min_px)
            covered = next((a for a, pts in _data_points(axes)
                            if a.get_zorder() <= lg.get_zorder() and inner.count_contains(pts) > 0), None)
            if covered is not None:
                problems.append(f"{legend} data of {getattr(covered, 'get_label', lambda: '?')()!r} in "
                                f"{_name(axes.title) if axes.get_title() else 'a panel'}")
    for ax in fig.axes:
        for c in ax.collections:
            if not isinstance(c, PathCollection) or not c.get_visible() or not len(c.get_offsets()):
                continue
            centres = c.get_offset_transform().transform(np.asarray(c.get_offsets()))
            sizes = np.resize(np.asarray(c.get_sizes(), dtype=float), len(centres))  # points^2 per marker
            half = np.sqrt(sizes) / 2 * fig.dpi / 72  # half a marker's width, in pixels
            for t, box in texts:
                if t.axes is not ax or c.get_zorder() <= t.get_zorder():
                    continue
                hit = ((np.minimum(box.x1, centres[:, 0] + half) - np.maximum(box.x0, centres[:, 0] - half) > min_px)
                       & (np.minimum(box.y1, centres[:, 1] + half) - np.maximum(box.y0, centres[:, 1] - half) > min_px))
                if hit.any():
                    problems.append(f"a marker ({c.get_label()!r}) is drawn over text {_name(t)}")
    for t, box in texts:
        clip = t.get_clip_box() if t.get_clip_on() else None
        if clip is not None and t.axes is not None and not _inside(box, clip, min_px):
            problems.append(f"text {_name(t)} is clipped by its panel's edge")
        elif t.axes is not None and t in t.axes.texts and t.axes.axison:
            frame = t.axes.patch.get_window_extent(renderer)
            if box.y1 > frame.y1 + min_px or box.y0 < frame.y0 - min_px:
                problems.append(f"text {_name(t)} runs past its panel's top or bottom edge")
    return list(dict.fromkeys(problems))


def _inside(box: Bbox, clip: Bbox, min_px: float) -> bool:
    return (box.x0 >= clip.x0 - min_px and box.x1 <= clip.x1 + min_px and box.y0 >= clip.y0 - min_px
            and box.y1 <= clip.y1 + min_px)
