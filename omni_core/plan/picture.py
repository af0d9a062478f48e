"""The deployment plan as a picture: an SVG of the stage graph, and an HTML page around it.

Why a picture: a plan's tables say where each stage runs, but not how a
request flows through seven processes on two GPUs, nor which edges cross a
process boundary. ``omni plan --format svg|html`` draws it for hardware you do
not have, and ``omni serve`` hands the same SVG to its playground, which
paints live state (process health, per-stage queues) onto it. So the drawing
is deterministic and every element the live view updates carries stable
attributes: ``data-process`` on a process box, ``data-stage`` (the stage's
name, as ``/health`` reports queues) and ``data-instance`` on a stage node,
and empty ``process-live`` / ``stage-live`` text lines to write into.

The layout is a small layered drawing written here (no graphviz: it is not
installable everywhere, and ``omni plan`` must stay dependency-free):

- each OS process is a box holding its stage instances, laid out left to
  right by their depth inside the process;
- boxes go into columns by their depth in the process graph (longest path
  from a process no edge enters; tensor-parallel ranks beside their leader);
- an edge that skips columns reserves a slot in each column it crosses, so it
  passes between boxes rather than through them, and the boxes of a column
  are ordered by the positions of their neighbours (a few barycenter sweeps)
  to keep edges short and uncrossed.

Colour says which GPU a process is on (the CPU is grey) and every box also
says it in words; ``stream_to`` edges are dashed; an edge between processes
is labelled with its transport. Only the standard library is used.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from html import escape

from ..schema.sizes import format_bytes
from .model import DeploymentPlan, ProcessPlan, StagePlacement

# -- geometry (px) -----------------------------------------------------------------

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', Arial, sans-serif"
CHAR = 0.58  # a generous average glyph width, in ems, for sizing boxes around text
MARGIN = 24
TITLE_H = 58
NODE_W = 150
NODE_H = 58
PAD = 12
HEADER_H = 58
INNER_GAP = 44  # between the columns of stages inside one box
INNER_ROW_GAP = 12
COL_GAP = 72  # between columns of boxes: room for an edge and its label
ROW_GAP = 26
SLOT_H = 18  # the room an edge crossing a column keeps free
LANE_GAP = 14  # between the lanes under the boxes that edges running backwards take
LEGEND_ROW_H = 26
SWEEPS = 4
# The live line of a process box (written by the playground) must fit a usual value; a
# longer one is squeezed to the box (its ``data-max-width``) by the page.
LIVE_SAMPLE = "healthy · 0 restarts · 0 in flight"

# (fill of the box, stroke / accent) per GPU; the CPU is grey. Light fills keep text legible.
GPU_COLOURS = (
    ("#e8f1fb", "#2f6fb3"),
    ("#fdf0e2", "#c0620b"),
    ("#e6f4ea", "#2b7a3d"),
    ("#f1eafa", "#7040a8"),
    ("#e3f5f5", "#1d7a7a"),
    ("#fbe9ec", "#b0304a"),
    ("#f3f3dc", "#6f6a12"),
    ("#fae8f5", "#a3338a"),
)
CPU_COLOURS = ("#f1f1f1", "#666666")
INK = "#1f2328"
MUTED = "#57606a"


def gpu_colours(gpu: int | None) -> tuple[str, str]:
    """The (fill, stroke) pair of a GPU, or of the CPU for ``None``."""
    return CPU_COLOURS if gpu is None else GPU_COLOURS[gpu % len(GPU_COLOURS)]


def text_width(text: str, size: float, bold: bool = False) -> float:
    return len(text) * size * (CHAR + (0.05 if bold else 0.0))


# -- the pieces of the drawing -----------------------------------------------------------


@dataclass
class _Node:
    """One stage instance inside one process box (a TP stage has a node per rank)."""

    process: ProcessPlan
    placement: StagePlacement
    lines: tuple[str, str]
    x: float = 0.0  # relative to the box until placed
    y: float = 0.0
    w: float = NODE_W
    h: float = NODE_H
    depth: int = 0

    @property
    def leads(self) -> bool:
        """Whether edges attach here: the stage's own process (TP rank 0), not another rank."""
        return self.placement.process == self.process.name


@dataclass
class _Slot:
    """Room an edge keeps free where it crosses a column of nodes inside a box."""

    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = SLOT_H

    @property
    def centre(self) -> tuple[float, float]:
        return self.x, self.y + self.h / 2


@dataclass
class _Unit:
    """What a column holds: a process box, or the slot an edge crossing the column keeps."""

    key: str
    process: ProcessPlan | None = None
    nodes: list[_Node] = field(default_factory=list)
    slots: list[_Slot] = field(default_factory=list)  # inside the box
    w: float = 0.0
    h: float = SLOT_H
    x: float = 0.0
    y: float = 0.0
    column: int = 0

    @property
    def centre(self) -> tuple[float, float]:
        return self.x + self.w / 2, self.y + self.h / 2


@dataclass
class _Edge:
    source: _Node
    target: _Node
    stream: bool
    transport: str | None
    via: list[_Unit | _Slot] = field(default_factory=list)
    lane: float | None = None  # y of the lane under the boxes, for an edge running backwards


class _Ids:
    """Element ids that are valid XML names and unique, from names that may hold ``@``."""

    def __init__(self) -> None:
        self.taken: set[str] = set()

    def __call__(self, *parts: str) -> str:
        base = "-".join(re.sub(r"[^A-Za-z0-9_.-]", "_", p) for p in parts)
        candidate, n = base, 1
        while candidate in self.taken:
            n += 1
            candidate = f"{base}-{n}"
        self.taken.add(candidate)
        return candidate


# -- layout ------------------------------------------------------------------------------


def _node_lines(process: ProcessPlan, placement: StagePlacement) -> tuple[str, str]:
    if placement.process != process.name:  # a tensor-parallel rank other than the leader
        return placement.instance, f"TP rank {process.tp_rank} of {placement.tp_size}"
    if not placement.gpus:
        return placement.instance, "on the host"
    parts = []
    if placement.tp_size > 1:
        parts.append(f"TP {placement.tp_size}, GPUs {','.join(map(str, placement.gpus))}")
    if placement.gpu_memory_fraction is not None:
        parts.append(f"memory {placement.gpu_memory_fraction:g}")
    if placement.total_reserve_bytes is not None:
        parts.append(f"reserve {format_bytes(placement.total_reserve_bytes)}")
    if placement.engine_memory_fraction is not None:
        parts.append(f"engine: mem_fraction_static {placement.engine_memory_fraction:g}")
    return placement.instance, ", ".join(parts) or "memory share undeclared"


def _process_lines(process: ProcessPlan) -> tuple[str, str]:
    where = "CPU" if process.gpu is None else f"GPU {process.gpu}"
    node = process.node  # multi-node plans name the host of each process
    if node:
        local = process.node_gpu
        where += f" on {node}" + (f" (its GPU {local})" if local not in (None, process.gpu) else "")
    extras = []
    if process.num_replicas > 1:
        extras.append(f"replica {process.replica + 1} of {process.num_replicas}")
    if process.tp_rank is not None:
        extras.append(f"TP rank {process.tp_rank} of {process.tp_size}")
    if process.weight_share != "none":
        extras.append(f"weights: {process.weight_share}")
    return process.name, " · ".join([where, *extras])


def _depths(order: list[str], edges: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Longest-path depth of every key; a cycle is broken at its earliest key in ``order``."""
    preds: dict[str, set[str]] = {k: set() for k in order}
    for a, b in edges:
        if a != b:
            preds[b].add(a)
    depth: dict[str, int] = {}
    remaining = list(order)
    while remaining:
        ready = [k for k in remaining if preds[k] <= depth.keys()]
        if not ready:  # a cycle: place its first key as if its unplaced sources were not there
            ready = remaining[:1]
        for key in ready:
            placed = [depth[p] + 1 for p in preds[key] if p in depth]
            depth[key] = max(placed, default=0)
            remaining.remove(key)
    return depth


class _Layout:
    """Where every box, node, edge and slot goes; sizes in px, origin at the top left."""

    def __init__(self, plan: DeploymentPlan):
        self.plan = plan
        placements = {s.instance: s for s in plan.stages}
        self.units: dict[str, _Unit] = {}
        for process in plan.processes:
            unit = _Unit(key=process.name, process=process)
            for instance in process.stages:
                placement = placements[instance]
                unit.nodes.append(_Node(process, placement, _node_lines(process, placement)))
            self.units[process.name] = unit
        self.edges = self._edges()
        for unit in self.units.values():
            self._size_box(unit)
        self.columns = self._columns()
        self._order()
        self._place()

    # the graph

    def _edges(self) -> list[_Edge]:
        """Stage edges between nodes: within a replica, or between any replicas of two
        different logical processes (a request is bound to one replica of each)."""
        by_stage: dict[str, list[_Node]] = {}
        for unit in self.units.values():
            for node in unit.nodes:
                if node.leads:
                    by_stage.setdefault(node.placement.stage, []).append(node)
        edges = []
        for edge in self.plan.edges:
            # per pair of processes, where the plan says (a link crossing hosts may differ)
            links = {(k.source, k.target): k.transport for k in edge.links}
            for a in by_stage.get(edge.source, []):
                for b in by_stage.get(edge.target, []):
                    same = a.process.name == b.process.name
                    if same or a.process.logical != b.process.logical:
                        pair = (a.process.name, b.process.name)
                        transport = None if same else links.get(pair, edge.transport)
                        edges.append(_Edge(a, b, edge.stream, transport))
        return edges

    def _size_box(self, unit: _Unit) -> None:
        """Nodes inside a box in columns by their depth within the process, each column
        centred; an edge that skips a column passes through a slot kept in its middle."""
        assert unit.process is not None
        nodes = unit.nodes
        inner = [e for e in self.edges if e.source.process is e.target.process is unit.process]
        depth = _depths(
            [n.placement.instance for n in nodes],
            [(e.source.placement.instance, e.target.placement.instance) for e in inner],
        )
        columns: dict[int, list[_Node | _Slot]] = {}
        for node in nodes:
            node.depth = depth[node.placement.instance]
            name, detail = node.lines
            node.w = max(NODE_W, text_width(name, 13, True) + 2 * PAD, text_width(detail, 11) + 20)
            columns.setdefault(node.depth, []).append(node)
        for edge in inner:
            for d in range(edge.source.depth + 1, edge.target.depth):
                slot = _Slot()
                columns[d].insert(len(columns[d]) // 2, slot)
                edge.via.append(slot)
                unit.slots.append(slot)
        heights = {
            d: sum(item.h for item in items) + INNER_ROW_GAP * (len(items) - 1)
            for d, items in columns.items()
        }
        tallest = max(heights.values(), default=0.0)
        x = PAD
        for d in sorted(columns):
            width = max(item.w for item in columns[d])
            y = HEADER_H + (tallest - heights[d]) / 2
            for item in columns[d]:
                if isinstance(item, _Slot):
                    item.x, item.y = x + width / 2, y
                else:
                    item.w, item.x, item.y = width, x, y
                y += item.h + INNER_ROW_GAP
            x += width + INNER_GAP
        name, where = _process_lines(unit.process)
        header = max(text_width(name, 14, True), text_width(where, 12), text_width(LIVE_SAMPLE, 11))
        unit.w = max(x - INNER_GAP + PAD, header + 2 * PAD, NODE_W + 2 * PAD)
        unit.h = HEADER_H + max(tallest, NODE_H) + PAD
        if len(columns) == 1:  # one column of nodes fills its box
            for node in nodes:
                node.w = unit.w - 2 * PAD

    def _columns(self) -> list[list[_Unit]]:
        processes = self.plan.processes
        links = {
            (e.source.process.name, e.target.process.name)
            for e in self.edges
            if e.source.process is not e.target.process
        }
        depth = _depths([p.name for p in processes], sorted(links))
        for process in processes:  # TP ranks stand beside their leader
            if process.tp_rank:
                leader = next(
                    (
                        q.name
                        for q in processes
                        if q.logical == process.logical
                        and q.replica == process.replica
                        and q.tp_rank == 0
                    ),
                    None,
                )
                if leader is not None:
                    depth[process.name] = depth[leader]
        count = max(depth.values(), default=-1) + 1
        columns: list[list[_Unit]] = [[] for _ in range(count)]
        for process in processes:
            unit = self.units[process.name]
            unit.column = depth[process.name]
            columns[unit.column].append(unit)
        slots: dict[tuple[str, str], list[_Unit]] = {}
        for a, b in sorted(links):
            if depth[b] - depth[a] <= 1:
                continue
            chain = []
            for column in range(depth[a] + 1, depth[b]):
                slot = _Unit(key=f"slot:{a}->{b}@{column}", column=column)
                middle = len(columns[column]) // 2  # edges through the middle read best
                columns[column].insert(middle, slot)
                chain.append(slot)
            slots[(a, b)] = chain
        for edge in self.edges:
            if edge.source.process is not edge.target.process:  # inner edges keep their slots
                edge.via = slots.get((edge.source.process.name, edge.target.process.name), [])
        return columns

    # ordering and coordinates

    def _neighbours(self) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        """Unit keys before and after each unit, through slots as through boxes."""
        before: dict[str, set[str]] = {}
        after: dict[str, set[str]] = {}
        for edge in self.edges:
            if edge.source.process is edge.target.process:
                continue  # inside one box: no bearing on the order of boxes
            keys = [
                edge.source.process.name,
                *(s.key for s in edge.via if isinstance(s, _Unit)),
                edge.target.process.name,
            ]
            for a, b in itertools.pairwise(keys):
                if a != b:
                    after.setdefault(a, set()).add(b)
                    before.setdefault(b, set()).add(a)
        return before, after

    def _order(self) -> None:
        """Barycenter sweeps, down then up; ties keep the plan's order."""
        before, after = self._neighbours()
        for sweep in range(SWEEPS):
            down = sweep % 2 == 0
            indices = range(1, len(self.columns)) if down else range(len(self.columns) - 2, -1, -1)
            links = before if down else after
            for i in indices:
                ref = self.columns[i - 1] if down else self.columns[i + 1]
                where = {u.key: (k + 0.5) / len(ref) for k, u in enumerate(ref)}
                column = self.columns[i]

                self.columns[i] = _by_barycenter(column, where, links)

    def _place(self) -> None:
        """Columns left to right, each centred vertically; slots are points on the centre line."""
        heights = [
            sum(u.h for u in column) + ROW_GAP * (len(column) - 1) for column in self.columns
        ]
        self.graph_h = max(heights, default=0.0)
        x = MARGIN
        for column, height in zip(self.columns, heights, strict=True):
            width = max((u.w for u in column), default=0.0)
            y = MARGIN + TITLE_H + (self.graph_h - height) / 2
            for unit in column:
                unit.x, unit.y = x + (width - unit.w) / 2, y
                if unit.process is None:
                    unit.w, unit.x = 0.0, x + width / 2
                y += unit.h + ROW_GAP
                for item in [*unit.nodes, *unit.slots]:
                    item.x += unit.x
                    item.y += unit.y
            x += width + COL_GAP
        self.graph_w = x - COL_GAP - MARGIN if self.columns else 0.0
        # An edge into a stage left of its source (a process graph with a cycle) runs back
        # along a lane of its own under the boxes, rather than across them.
        backwards = [e for e in self.edges if e.target.x <= e.source.x + e.source.w]
        for index, edge in enumerate(backwards):
            edge.lane = MARGIN + TITLE_H + self.graph_h + LANE_GAP * (index + 1)
        self.graph_h += LANE_GAP * len(backwards)


def _by_barycenter(
    column: list[_Unit], where: dict[str, float], links: dict[str, set[str]]
) -> list[_Unit]:
    """``column`` sorted by the mean position of each unit's neighbours in the reference column
    (``where``: key -> position in 0..1); a unit without any keeps its own position."""

    def key(item: tuple[int, _Unit]) -> float:
        k, unit = item
        seen = [where[n] for n in links.get(unit.key, ()) if n in where]
        return sum(seen) / len(seen) if seen else (k + 0.5) / len(column)

    return [u for _, u in sorted(enumerate(column), key=key)]


# -- drawing -----------------------------------------------------------------------------


def _text(x: float, y: float, text: str, size: float, **attrs: str) -> str:
    extra = "".join(f' {k.rstrip("_").replace("_", "-")}="{escape(v)}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size:g}"{extra}>{escape(text)}</text>'


def _path(edge: _Edge) -> tuple[str, tuple[float, float]]:
    """A smooth left-to-right path through the edge's slots, and where its label goes."""
    s, t = edge.source, edge.target
    if edge.lane is not None:  # out to the right, back along the lane, in from the left
        (xa, ya), (xb, yb), lane = (s.x + s.w, s.y + s.h / 2), (t.x, t.y + t.h / 2), edge.lane
        out, back = xa + 24, xb - 24
        d = (
            f"M{xa:.1f},{ya:.1f} C{out:.1f},{ya:.1f} {out:.1f},{lane:.1f} {xa:.1f},{lane:.1f}"
            f" L{xb:.1f},{lane:.1f} C{back:.1f},{lane:.1f} {back:.1f},{yb:.1f} {xb:.1f},{yb:.1f}"
        )
        return d, ((xa + xb) / 2, lane)
    points = [(s.x + s.w, s.y + s.h / 2), *(u.centre for u in edge.via), (t.x, t.y + t.h / 2)]
    d = [f"M{points[0][0]:.1f},{points[0][1]:.1f}"]
    for (xa, ya), (xb, yb) in itertools.pairwise(points):
        bend = max(abs(xb - xa) / 2, 30.0)
        d.append(f"C{xa + bend:.1f},{ya:.1f} {xb - bend:.1f},{yb:.1f} {xb:.1f},{yb:.1f}")
    middle = len(points) // 2  # the label sits halfway along the middle segment
    (xa, ya), (xb, yb) = points[middle - 1], points[middle]
    return " ".join(d), ((xa + xb) / 2, (ya + yb) / 2)


def _draw_edge(edge: _Edge, ids: _Ids) -> list[str]:
    d, (lx, ly) = _path(edge)
    s, t = edge.source, edge.target
    crossing = s.process is not t.process
    colour = INK if crossing else MUTED
    dash = ' stroke-dasharray="7 5"' if edge.stream else ""
    source, target = s.placement.instance, t.placement.instance
    out = [
        f'<g class="edge" id="{ids("edge", s.process.name, source, target)}"'
        f' data-source="{escape(source)}" data-target="{escape(target)}"'
        f' data-stream="{str(edge.stream).lower()}"'
        f' data-transport="{escape(edge.transport or "")}">',
        f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="1.6"{dash}'
        ' marker-end="url(#omni-arrow)"/>',
    ]
    if crossing and edge.transport:
        w = text_width(edge.transport, 11) + 10
        out.append(
            f'<rect x="{lx - w / 2:.1f}" y="{ly - 9:.1f}" width="{w:.1f}" height="17" rx="8"'
            f' fill="#ffffff" stroke="{colour}" stroke-width="0.8"/>'
        )
        out.append(_text(lx, ly + 4, edge.transport, 11, text_anchor="middle", fill=INK))
    out.append("</g>")
    return out


def _draw_box(unit: _Unit, ids: _Ids) -> list[str]:
    process = unit.process
    assert process is not None
    fill, stroke = gpu_colours(process.gpu)
    name, where = _process_lines(process)
    gpu = "cpu" if process.gpu is None else str(process.gpu)
    x, y = unit.x, unit.y
    out = [
        f'<g class="process" id="{ids("process", process.name)}"'
        f' data-process="{escape(process.name)}" data-logical="{escape(process.logical)}"'
        f' data-gpu="{gpu}">',
        f'<rect class="process-box" x="{x:.1f}" y="{y:.1f}" width="{unit.w:.1f}"'
        f' height="{unit.h:.1f}" rx="10" fill="{fill}" stroke="{stroke}" stroke-width="1.6"/>',
        _text(x + PAD, y + 20, name, 14, font_weight="700", fill=INK),
        _text(x + PAD, y + 36, where, 12, fill=stroke, font_weight="600"),
        _text(
            x + PAD,
            y + 51,
            "",
            11,
            fill=MUTED,
            class_="process-live",
            data_max_width=f"{unit.w - 2 * PAD:.0f}",
        ),
    ]
    for node in unit.nodes:
        instance, detail = node.lines
        out += [
            f'<g class="stage" id="{ids("stage", process.name, instance)}"'
            f' data-stage="{escape(node.placement.stage)}" data-instance="{escape(instance)}"'
            f' data-process="{escape(process.name)}">',
            f'<rect class="stage-box" x="{node.x:.1f}" y="{node.y:.1f}" width="{node.w:.1f}"'
            f' height="{node.h:.1f}" rx="6" fill="#ffffff" stroke="{stroke}" stroke-width="1.2"/>',
            _text(node.x + 10, node.y + 18, instance, 13, font_weight="600", fill=INK),
            _text(node.x + 10, node.y + 33, detail, 11, fill=MUTED),
            _text(
                node.x + 10,
                node.y + 49,
                "",
                11,
                fill=INK,
                class_="stage-live",
                data_max_width=f"{node.w - 20:.0f}",
            ),
            "</g>",
        ]
    out.append("</g>")
    return out


def _legend_items(plan: DeploymentPlan) -> list[tuple[str, str]]:
    """(kind, label) pairs: one per GPU the plan uses or has, the CPU, then the edge styles."""
    items = []
    gpus = sorted({*plan.gpus, *(p.gpu for p in plan.processes if p.gpu is not None)})
    for gpu in gpus:
        usage = plan.gpus.get(gpu)
        memory = format_bytes(usage.memory_bytes) if usage and usage.memory_bytes else "memory ?"
        count = len(usage.processes) if usage else 0
        noun = "process" if count == 1 else "processes"
        items.append((f"gpu:{gpu}", f"GPU {gpu} · {memory} · {count} {noun}"))
    if any(p.gpu is None for p in plan.processes):
        items.append(("gpu:cpu", "CPU (host)"))
    items.append(("solid", "output, sent when the stage finishes"))
    items.append(("dashed", "stream_to: chunks sent while the stage runs"))
    if any(e.transport for e in plan.edges):
        items.append(("label", "transport between processes (none inside one)"))
    return items


def _draw_legend(plan: DeploymentPlan, width: float, top: float) -> tuple[list[str], float]:
    out = ['<g class="legend">']
    x, y = MARGIN, top
    for kind, label in _legend_items(plan):
        item_w = 34 + text_width(label, 12) + 22
        if x + item_w > width - MARGIN and x > MARGIN:
            x, y = MARGIN, y + LEGEND_ROW_H
        if kind.startswith("gpu:"):
            gpu = kind[4:]
            fill, stroke = gpu_colours(None if gpu == "cpu" else int(gpu))
            out.append(
                f'<rect x="{x:.1f}" y="{y - 11:.1f}" width="26" height="16" rx="4"'
                f' fill="{fill}" stroke="{stroke}" stroke-width="1.6" data-legend-gpu="{gpu}"/>'
            )
        elif kind == "label":
            out.append(
                f'<rect x="{x:.1f}" y="{y - 11:.1f}" width="28" height="16" rx="8" fill="#ffffff"'
                f' stroke="{INK}" stroke-width="0.8"/>'
            )
            out.append(_text(x + 14, y + 1, "shm", 11, text_anchor="middle", fill=INK))
        else:
            dash = ' stroke-dasharray="7 5"' if kind == "dashed" else ""
            out.append(
                f'<path d="M{x:.1f},{y - 3:.1f} h26" stroke="{INK}" stroke-width="1.6"{dash}'
                ' marker-end="url(#omni-arrow)"/>'
            )
        out.append(_text(x + 34, y + 1, label, 12, fill=INK))
        x += item_w
    out.append("</g>")
    return out, y + LEGEND_ROW_H - top


def _title(plan: DeploymentPlan, model: str | None = None) -> tuple[str, str]:
    gpus = sorted({p.gpu for p in plan.processes if p.gpu is not None})
    where = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}" if gpus else "the CPU"
    count = len(plan.processes)
    title = f"{plan.pipeline}: {count} process{'es' if count != 1 else ''} on {where}"
    hosts = {p.node for p in plan.processes} - {None}
    if len(hosts) > 1:
        title += f", across {len(hosts)} nodes"
    sub = (
        f"model {(plan.model_path if model is None else model) or '-'} · placement {plan.policy} · "
        f"inventory {plan.inventory.describe()}"
    )
    return title, sub


def plan_svg(plan: DeploymentPlan, *, model: str | None = None) -> str:
    """The plan's stage graph as a standalone SVG document (a string, UTF-8 text).

    ``model`` replaces ``plan.model_path`` in the caption: ``omni serve`` hands
    the picture to clients, who get the model's name and not a host path.
    """
    layout = _Layout(plan)
    ids = _Ids()
    title, sub = _title(plan, model)
    legend_top = MARGIN + TITLE_H + layout.graph_h + 34
    content_w = max(layout.graph_w, text_width(title, 18, True), text_width(sub, 12))
    width = content_w + 2 * MARGIN
    legend, legend_h = _draw_legend(plan, width, legend_top)
    height = legend_top + legend_h + MARGIN - 8
    stage_names = ", ".join(s.instance for s in plan.stages)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="omni-plan" role="img"'
        f' viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}"'
        f' font-family="{escape(FONT)}" aria-labelledby="omni-plan-title omni-plan-desc"'
        f' data-pipeline="{escape(plan.pipeline)}">',
        f'<title id="omni-plan-title">{escape(title)}</title>',
        f'<desc id="omni-plan-desc">{escape(sub)}. Stages: {escape(stage_names)}.</desc>',
        "<defs>",
        '<marker id="omni-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7"'
        ' markerHeight="7" orient="auto-start-reverse">'
        f'<path d="M0,0 L10,5 L0,10 z" fill="{INK}"/></marker>',
        "</defs>",
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
        _text(MARGIN, MARGIN + 16, title, 18, font_weight="700", fill=INK),
        _text(MARGIN, MARGIN + 36, sub, 12, fill=MUTED),
    ]
    for column in layout.columns:
        for unit in column:
            if unit.process is not None:
                out += _draw_box(unit, ids)
    for edge in layout.edges:  # over the boxes, so arrows into a box stay visible
        out += _draw_edge(edge, ids)
    out += legend
    out.append("</svg>")
    return "\n".join(out) + "\n"


_PAGE_CSS = (
    f"body {{ font-family: {FONT}; color: {INK}; margin: 1.5rem; }}"
    + """
h1 { font-size: 1.3rem; }
.picture { overflow-x: auto; border: 1px solid #d0d7de; border-radius: 8px; }
.picture svg { display: block; max-width: none; }
table { border-collapse: collapse; margin-top: 1rem; font-size: 0.9rem; }
th, td { border: 1px solid #d0d7de; padding: 0.3rem 0.6rem; text-align: left; }
th { background: #f6f8fa; }
"""
)


def plan_html(plan: DeploymentPlan) -> str:
    """A standalone page (well-formed XHTML): the picture, then the processes as a table."""
    title, sub = _title(plan)
    rows = []
    for process in plan.processes:
        name, where = _process_lines(process)
        rows.append(
            f"<tr><td>{escape(name)}</td><td>{escape(where)}</td>"
            f"<td>{escape(', '.join(process.stages))}</td></tr>"
        )
    edges = [
        f"<li>{escape(e.source)} → {escape(e.target)}: "
        f"{escape(e.transport or 'in process')}{', streamed' if e.stream else ''}</li>"
        for e in plan.edges
    ]
    notes = "".join(f"<li>{escape(n)}</li>" for n in plan.notes)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html xmlns="http://www.w3.org/1999/xhtml" lang="en">',
            '<head><meta charset="utf-8"/>',
            '<meta name="viewport" content="width=device-width, initial-scale=1"/>',
            f"<title>{escape(title)}</title>",
            f"<style>{_PAGE_CSS}</style></head>",
            "<body>",
            f"<h1>{escape(title)}</h1>",
            f"<p>{escape(sub)}</p>",
            f'<div class="picture">{plan_svg(plan)}</div>',
            "<h2>Processes</h2>",
            "<table><thead><tr><th>process</th><th>where</th><th>stages</th></tr></thead>",
            f"<tbody>{''.join(rows)}</tbody></table>",
            "<h2>Edges</h2>",
            f"<ul>{''.join(edges) or '<li>none</li>'}</ul>",
            *([f"<h2>Notes</h2><ul>{notes}</ul>"] if notes else []),
            "</body>",
            "</html>",
            "",
        ]
    )
