"""The benchmarks as pictures: SVG line charts of the figures the scripts wrote into
benchmarks/charts/ (``bench.json`` from bench.py, ``renewal.json`` and ``renewal_client.json``
from renewal.py's parts 1 and 4), drawn next to them. Nothing is measured here, and a chart whose
figures are missing is skipped.

    .venv/bin/python benchmarks/plots.py        # make bench runs it last

- ``throughput.svg``: a hot lock's acquisitions per second against the number of tasks waiting
  for it, in one process and over four, for this library and redis-py's asyncio lock.
- ``handoff.svg``: the distribution of cross-process hand-off latency (one process leaves its
  critical section, the other enters its own), as the share of hand-offs faster than each latency.
- ``renewal.svg``: the heartbeat's renewal time per lease against the leases one process holds.
- ``renewal_client.svg``: the client's side of holding 100 to 10,000 heartbeat leases in one
  process (renewal requests, CPU and memory per lease, CPU per acquisition), this checkout and a
  baseline (``renewal.json`` and ``renewal_client.json``, from renewal.py's parts 1 and 4).
- ``many_names.svg``: 4 x 64 tasks over pools of names, the library's acquisitions per second
  against the raw request pair's, and as more processes keep a change stream open, the server's CPU
  per acquisition and the events each of them is sent (``many_names.py``).
- ``view_scale.svg``: the dashboard and ``mongolock list`` at 1,000 to 100,000 locks (bytes a page
  is sent, times, memory) against the raw driver reading the same documents (``view_scale.py``).
- ``idle_cleanup.svg``: a collection's size over time while released names are written and the
  idle-cleanup index sweeps them, beside the names written so far (``idle_cleanup.py``).

No plotting library: a few SVG elements written as text, the same figures giving the same file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

CHARTS = Path(__file__).parent / "charts"
COLOURS = ("#1d4ed8", "#0f766e", "#b91c1c", "#c2410c", "#6b7280", "#7c3aed")
DASHES = ("", "6 3", "2 3", "8 3 2 3")
FONT = "font-family=\"system-ui, -apple-system, 'Segoe UI', sans-serif\""


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    colour: str
    dash: str = ""
    step: bool = False
    """Drawn as a staircase (a distribution) rather than a line through markers."""


@dataclass
class Axis:
    label: str
    low: float
    high: float
    log: bool = False
    ticks: list[float] = field(default_factory=list)
    tick_text: Callable[[float], str] = lambda value: f"{value:g}"

    def fraction(self, value: float) -> float:
        if self.log:
            return (math.log10(value) - math.log10(self.low)) / (math.log10(self.high) - math.log10(self.low))
        return (value - self.low) / (self.high - self.low)


@dataclass
class Panel:
    title: str
    x: Axis
    y: Axis
    series: list[Series]


def _number(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def chart(
    title: str, subtitles: Sequence[str], panels: Sequence[Panel], *, panel_width: int = 420, height: int = 300
) -> str:
    """An SVG of ``panels`` side by side, under a title and lines of subtitle, with one legend per
    panel below it."""
    left, right, bottom = 62, 16, 46
    top = 44 + 16 * len(subtitles) + 12
    legend_rows = max(len(panel.series) for panel in panels)
    width = len(panels) * (panel_width + left + right)
    total_height = top + height + bottom + 18 * legend_rows + 8
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {total_height}" width="{width}" '
        f'height="{total_height}" {FONT} font-size="12">',
        f'<rect width="{width}" height="{total_height}" fill="#ffffff"/>',
        f'<text x="12" y="22" font-size="15" font-weight="600" fill="#111827">{escape(title)}</text>',
    ]
    out += [
        f'<text x="12" y="{40 + 16 * line}" fill="#6b7280">{escape(text)}</text>' for line, text in enumerate(subtitles)
    ]
    for index, panel in enumerate(panels):
        x0 = index * (panel_width + left + right) + left
        y0 = top

        def px(value: float, panel: Panel = panel, x0: int = x0) -> str:
            return _number(x0 + panel_width * panel.x.fraction(value))

        def py(value: float, panel: Panel = panel, y0: int = y0) -> str:
            return _number(y0 + height * (1 - panel.y.fraction(value)))

        out.append(f'<text x="{x0}" y="{y0 - 6}" font-weight="600" fill="#111827">{escape(panel.title)}</text>')
        out.append(f'<rect x="{x0}" y="{y0}" width="{panel_width}" height="{height}" fill="none" stroke="#d1d5db"/>')
        for tick in panel.x.ticks:
            out.append(f'<line x1="{px(tick)}" x2="{px(tick)}" y1="{y0}" y2="{y0 + height}" stroke="#eef0f3"/>')
            out.append(f'<text x="{px(tick)}" y="{y0 + height + 16}" text-anchor="middle" fill="#374151">'
                       f"{escape(panel.x.tick_text(tick))}</text>")  # fmt: skip
        for tick in panel.y.ticks:
            out.append(f'<line x1="{x0}" x2="{x0 + panel_width}" y1="{py(tick)}" y2="{py(tick)}" stroke="#eef0f3"/>')
            out.append(f'<text x="{x0 - 6}" y="{_number(float(py(tick)) + 4)}" text-anchor="end" fill="#374151">'
                       f"{escape(panel.y.tick_text(tick))}</text>")  # fmt: skip
        out.append(f'<text x="{_number(x0 + panel_width / 2)}" y="{y0 + height + 34}" text-anchor="middle" '
                   f'fill="#111827">{escape(panel.x.label)}</text>')  # fmt: skip
        middle = _number(y0 + height / 2)
        out.append(f'<text transform="translate({x0 - 46} {middle}) rotate(-90)" text-anchor="middle" '
                   f'fill="#111827">{escape(panel.y.label)}</text>')  # fmt: skip
        for series in panel.series:
            if not series.points:
                continue
            dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
            if series.step:
                path = [f"M{px(series.points[0][0])} {py(0.0)}"]
                previous_y = 0.0
                for x, y in series.points:
                    path.append(f"L{px(x)} {py(previous_y)} L{px(x)} {py(y)}")
                    previous_y = y
                out.append(f'<path d="{" ".join(path)}" fill="none" stroke="{series.colour}" stroke-width="2"{dash}/>')
                continue
            line = " ".join(f"{px(x)},{py(y)}" for x, y in series.points)
            out.append(f'<polyline points="{line}" fill="none" stroke="{series.colour}" stroke-width="2"{dash}/>')
            for x, y in series.points:
                out.append(f'<circle cx="{px(x)}" cy="{py(y)}" r="3" fill="{series.colour}"/>')
        for row, series in enumerate(panel.series):
            y = y0 + height + bottom + 14 + 18 * row
            dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
            out.append(f'<line x1="{x0}" x2="{x0 + 26}" y1="{y - 4}" y2="{y - 4}" stroke="{series.colour}" '
                       f'stroke-width="2"{dash}/>')  # fmt: skip
            out.append(f'<text x="{x0 + 32}" y="{y}" fill="#111827">{escape(series.name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _nice_top(value: float) -> float:
    """A round number at or above ``value`` for an axis to end at."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * magnitude >= value:
            return float(step * magnitude)
    return float(10 * magnitude)


def _linear_ticks(top: float, count: int = 5) -> list[float]:
    return [top * index / count for index in range(count + 1)]


def _machine(figures: dict[str, Any]) -> str:
    """The run's date, cores and server, from its environment line."""
    parts = [part.strip() for part in str(figures["environment"]).split("|")]
    keep = [part for part in parts if part.startswith(("date", "server embedded", "server MongoDB")) or "cores" in part]
    return ", ".join(keep)


_PEERS = "Redis in memory (C) against a MongoDB test double (Python): compare shapes, not speeds"
_BACKENDS = {
    "mongolock": ("mongolock", COLOURS[0], ""),
    "mongolock-fair": ("mongolock, fair=True", COLOURS[1], "6 3"),
    "redis": ("redis-py (0.1 s polling)", COLOURS[2], ""),
    "redis-fast": ("redis-py (5 ms polling)", COLOURS[3], "6 3"),
    "baseline": ("previous release", COLOURS[4], "2 3"),
}


def throughput(figures: dict[str, Any]) -> str:
    runs = figures["hot_lock"]
    panels = []
    top = _nice_top(max(run["acquisitions_per_second"] for run in runs) * 1.05)
    for processes in sorted({run["processes"] for run in runs}):
        series = []
        for backend, (name, colour, dash) in _BACKENDS.items():
            points = sorted(
                (float(run["tasks"]), float(run["acquisitions_per_second"]))
                for run in runs
                if run["backend"] == backend and run["processes"] == processes
            )
            if points:
                series.append(Series(name, points, colour, dash))
        tasks = sorted({float(run["tasks"]) for run in runs})
        panels.append(
            Panel(
                f"{processes} process{'es' if processes > 1 else ''}, one lock, 2 ms bodies",
                Axis("tasks taking the lock in turn (log scale)", min(tasks) / 1.3, max(tasks) * 1.3, log=True,
                     ticks=tasks, tick_text=lambda value: f"{value:g}"),
                Axis("acquisitions per second", 0.0, top, ticks=_linear_ticks(top)),
                series,
            )
        )
    return chart(
        "A hot lock: throughput against waiting tasks",
        [f"benchmarks/bench.py, {figures['seconds']:g} s counted per point", _PEERS, _machine(figures)],
        panels,
    )


def handoff(figures: dict[str, Any]) -> str:
    samples: dict[str, list[float]] = figures["hand_off_ms"]
    every = [value for values in samples.values() for value in values if value > 0]
    low = 10 ** math.floor(math.log10(max(0.1, min(every))))
    high = 10 ** math.ceil(math.log10(max(every)))
    ticks = [10.0**power for power in range(round(math.log10(low)), round(math.log10(high)) + 1)]
    series = []
    for backend, (name, colour, dash) in _BACKENDS.items():
        values = sorted(max(low, value) for value in samples.get(backend, []))
        if not values:
            continue
        points = [(value, (index + 1) / len(values)) for index, value in enumerate(values)]
        median = values[len(values) // 2]
        series.append(Series(f"{name}: {len(values)} hand-offs, p50 {median:.1f} ms", points, colour, dash, step=True))
    panel = Panel(
        "two processes, one task each, 20 ms bodies",
        Axis("hand-off latency, ms (log scale)", low, high, log=True, ticks=ticks, tick_text=lambda v: f"{v:g}"),
        Axis("share of hand-offs at most this fast", 0.0, 1.0, ticks=_linear_ticks(1.0, 4),
             tick_text=lambda value: f"{value:.0%}"),
        series,
    )  # fmt: skip
    return chart(
        "Cross-process hand-off latency: mongolock against redis-py",
        [f"benchmarks/bench.py, {figures['seconds']:g} s per backend", _PEERS, _machine(figures)],
        [panel],
        panel_width=640,
    )


def renewal(figures: dict[str, Any]) -> str:
    rows = figures["per_lease"]
    counts = [float(row["leases"]) for row in rows]
    top = _nice_top(max(max(row["chunks_ms"], row["update_many_ms"]) for row in rows) * 1.05)
    panel = Panel(
        "time per lease of renewing every lease once",
        Axis("leases held (log scale)", min(counts) / 1.4, max(counts) * 1.4, log=True, ticks=counts,
             tick_text=lambda value: f"{value:,.0f}"),
        Axis("ms per lease", 0.0, top, ticks=_linear_ticks(top)),
        [
            Series(f"the keeper: chunks of {figures['chunk']} leases, one request each",
                   [(float(row["leases"]), float(row["chunks_ms"])) for row in rows], COLOURS[0]),
            Series("one update_many with $in lists (the previous way)",
                   [(float(row["leases"]), float(row["update_many_ms"])) for row in rows], COLOURS[4], "6 3"),
        ],
    )  # fmt: skip
    return chart(
        "The heartbeat: renewal cost against leases held",
        ["benchmarks/renewal.py --part per-lease", _machine(figures)],
        [panel],
        panel_width=640,
    )


_CHECKOUTS = {"this": ("this checkout", COLOURS[0], ""), "baseline": ("baseline checkout", COLOURS[4], "6 3")}


def renewal_client(figures: dict[str, Any]) -> str:
    runs = figures["runs"]
    counts = sorted({float(run["leases"]) for run in runs})
    x = Axis("leases held by one process (log scale)", min(counts) / 1.5, max(counts) * 1.5, log=True, ticks=counts,
             tick_text=lambda value: f"{value:,.0f}")  # fmt: skip

    def panel(title: str, label: str, key: str, scale: float = 1.0, goal: float | None = None) -> Panel:
        series = []
        for checkout, (name, colour, dash) in _CHECKOUTS.items():
            mine = [run for run in runs if run["library"] == checkout]
            points = sorted((float(run["leases"]), float(run[key]) * scale) for run in mine)
            if points:
                series.append(Series(name, points, colour, dash))
        if goal is not None:
            series.append(Series(f"goal: at most {goal:g}", [(x.low, goal), (x.high, goal)], COLOURS[2], "2 3"))
        top = _nice_top(max(point[1] for one in series for point in one.points) * 1.15)
        return Panel(title, x, Axis(label, 0.0, top, ticks=_linear_ticks(top)), series)

    intervals = sorted({f"{run['interval_s']:g} s" for run in runs})
    by_ttl: dict[float, set[int]] = {}
    for run in runs:
        by_ttl.setdefault(run["ttl_s"], set()).add(run["leases"])
    ttls = ", ".join(f"{ttl:,g} s at {' and '.join(f'{n:,}' for n in sorted(counts))} leases"
                     for ttl, counts in sorted(by_ttl.items()))  # fmt: skip
    return chart(
        "The heartbeat's client side: cost per lease against leases held",
        [f"benchmarks/renewal.py --part client: heartbeat every {' or '.join(intervals)}, TTL {ttls}; "
         "flat lines are the goal", _machine(figures)],
        [
            panel("renewal requests per 100 leases", "requests per 100 leases per interval",
                  "requests_per_lease_interval", 100),
            panel("client CPU of renewing", "µs per lease per interval", "cpu_us_per_lease_interval"),
            panel("client memory (tracemalloc)", "bytes per lease held", "memory_bytes_per_lease", goal=1024),
            panel("client CPU of taking them", "µs per acquisition (tracemalloc on)", "acquire_cpu_us_per_lease"),
        ],
        panel_width=260,
    )  # fmt: skip


def _log_axis(label: str, values: Sequence[float], text: Callable[[float], str]) -> Axis:
    low = 10 ** math.floor(math.log10(max(1e-3, min(values))))
    high = 10 ** math.ceil(math.log10(max(values)))
    ticks = [10.0**power for power in range(round(math.log10(low)), round(math.log10(high)) + 1)]
    return Axis(label, low, high, log=True, ticks=ticks, tick_text=text)


def _compact(value: float) -> str:
    """1,000 as 1k and 10,000,000 as 10M: tick labels that fit the axis's margin."""
    for size, unit in ((1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:g}{unit}"
    return f"{value:g}"


def view_scale(figures: dict[str, Any]) -> str:
    runs = sorted(figures["runs"], key=lambda run: run["locks"])
    locks = [float(run["locks"]) for run in runs]
    x = Axis("lock documents (log scale)", min(locks) / 1.5, max(locks) * 1.5, log=True, ticks=locks,
             tick_text=lambda value: f"{value:,.0f}")  # fmt: skip

    def series(name: str, key: str, colour: str, dash: str = "", scale: float = 1.0) -> Series:
        return Series(name, [(float(run["locks"]), max(1e-3, float(run[key]) * scale)) for run in runs], colour, dash)

    sent = [
        series("dashboard: the first page (its window)", "first_page_bytes", COLOURS[0]),
        series("raw: every document as JSON", "raw_json_bytes", COLOURS[4], "6 3"),
        series("dashboard: an update in view", "update_bytes_inside", COLOURS[1]),
        series("raw: that write's change event", "raw_event_bytes_inside", COLOURS[3], "2 3"),
    ]
    timed = [
        series("dashboard: first paint, view opening", "first_paint_cold_ms", COLOURS[0]),
        series("dashboard: first paint, view open", "first_paint_warm_ms", COLOURS[1]),
        series("mongolock list --json", "list_json_s", COLOURS[2], scale=1000),
        series("raw: read every document", "raw_stream_s", COLOURS[4], "6 3", scale=1000),
    ]
    memory = [
        series("dashboard process", "dashboard_mb", COLOURS[0]),
        series("mongolock list --json", "list_json_mb", COLOURS[2]),
        series("raw: read a batch at a time", "raw_stream_mb", COLOURS[4], "6 3"),
        series("raw: every document held", "raw_hold_mb", COLOURS[3], "2 3"),
    ]

    def values(group: list[Series]) -> list[float]:
        return [point[1] for one in group for point in one.points]

    panels = [
        Panel("bytes a page is sent", x, _log_axis("bytes (log scale)", values(sent), _compact), sent),
        Panel("time", x, _log_axis("ms (log scale)", values(timed), _compact), timed),
        Panel("memory (peak, or resident for the dashboard)", x,
              _log_axis("MB (log scale)", values(memory), lambda v: f"{v:,.0f}"), memory),
    ]  # fmt: skip
    return chart(
        "The views at scale, against the raw driver reading the same documents",
        ["benchmarks/view_scale.py: a page's window of 100 names, list streaming a batch at a time",
         _machine(figures)],
        panels,
        panel_width=360,
    )  # fmt: skip


def many_names(figures: dict[str, Any]) -> str:
    pools = sorted(figures["pools"], key=lambda run: run["pool"])
    sizes = [float(run["pool"]) for run in pools]
    by_pool = Axis("names in the pool (log scale)", min(sizes) / 2, max(sizes) * 2, log=True, ticks=sizes,
                   tick_text=_compact)  # fmt: skip
    rates = [
        Series("library: acquisitions", [(float(run["pool"]), run["library"]["acquisitions_per_second"])
                                          for run in pools], COLOURS[0]),
        Series("raw findAndModify pairs, same processes", [(float(run["pool"]), run["raw"]["pairs_per_second"])
                                                          for run in pools], COLOURS[4], "6 3"),
    ]  # fmt: skip
    top = _nice_top(max(point[1] for one in rates for point in one.points) * 1.05)
    panels = [Panel("4 x 64 tasks, names drawn uniformly", by_pool,
                    Axis("per second", 0.0, top, ticks=_linear_ticks(top)), rates)]  # fmt: skip
    sweep = sorted(figures.get("streams", []), key=lambda point: point["listening_processes"])
    if sweep:
        counts = [float(point["listening_processes"]) for point in sweep]
        by_streams = Axis("processes keeping a stream open (log scale)", min(counts) / 1.5, max(counts) * 1.5,
                          log=True, ticks=counts, tick_text=lambda value: f"{value:g}")  # fmt: skip
        cpu = [(float(p["listening_processes"]), p["server_cpu_ms_per_acquisition"]) for p in sweep]
        events = [(float(p["listening_processes"]), p["events_per_listener_per_acquisition"]) for p in sweep]
        cpu_top = _nice_top(max(value for _, value in cpu) * 1.05)
        events_top = _nice_top(max(1.0, max(value for _, value in events)) * 1.05)
        panels += [
            Panel("the server's CPU per acquisition", by_streams,
                  Axis("ms", 0.0, cpu_top, ticks=_linear_ticks(cpu_top)),
                  [Series("embedded server process, user + system", cpu, COLOURS[0])]),
            Panel("change events sent to each of them", by_streams,
                  Axis("events per acquisition", 0.0, events_top, ticks=_linear_ticks(events_top)),
                  [Series("per listening process", events, COLOURS[2])]),
        ]  # fmt: skip
    return chart(
        "Many names: throughput against the raw requests, and the streams' cost",
        [f"benchmarks/many_names.py, {figures['seconds']:g} s counted per phase; the embedded server's "
         "findAndModify scans the collection: compare shapes, not speeds", _machine(figures),
         *([f"streams: {_machine(figures['streams_run'])}"] if "streams_run" in figures else [])],
        panels,
        panel_width=300,
    )  # fmt: skip


def idle_cleanup(figures: dict[str, Any]) -> str:
    panels = []
    for size, run in sorted(figures["runs"].items(), key=lambda item: int(item[0])):
        curve = run["curve"]
        end = _nice_top(max(point[0] for point in curve))
        top = _nice_top(max(point[1] for point in curve) * 1.05)
        panels.append(Panel(
            f"{int(size):,} idle names, seeded in {run['seeded_in']:g} s",
            Axis("seconds since the seeding started", 0.0, end, ticks=_linear_ticks(end)),
            Axis("documents", 0.0, top, ticks=_linear_ticks(top), tick_text=_compact),
            [Series("lock names written so far", [(p[0], float(p[1])) for p in curve], COLOURS[4], "6 3"),
             Series("documents in the collection", [(p[0], float(p[2])) for p in curve], COLOURS[0])],
        ))  # fmt: skip
    return chart(
        "Released names swept by the idle-cleanup index as they are written",
        ["benchmarks/idle_cleanup.py: the collection's size read every 5 s; names idle for 2 h, an index of 1 h",
         "the embedded server's TTL monitor wakes every 60 s as MongoDB's; its sweeps' speed says nothing of MongoDB's",
         _machine(figures)],
        panels,
        panel_width=360,
    )  # fmt: skip


DRAWN: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "throughput.svg": ("bench.json", throughput),
    "handoff.svg": ("bench.json", handoff),
    "renewal.svg": ("renewal.json", renewal),
    "renewal_client.svg": ("renewal_client.json", renewal_client),
    "view_scale.svg": ("view_scale.json", view_scale),
    "many_names.svg": ("many_names.json", many_names),
    "idle_cleanup.svg": ("idle_cleanup.json", idle_cleanup),
}


def main() -> None:
    for picture, (source, draw) in DRAWN.items():
        path = CHARTS / source
        if not path.exists():
            print(f"skipped {picture}: no {path} (run the benchmark that writes it)")
            continue
        (CHARTS / picture).write_text(draw(json.loads(path.read_text())))
        print(f"wrote {CHARTS / picture}")


if __name__ == "__main__":
    main()
