"""Draws a `urewrite trace --format perfetto` file the way Perfetto's timeline shows it,
into a PNG for the documentation (docs/perfetto.png). Needs matplotlib, which
urewrite itself does not.

    python3 samples/perfetto_picture.py TRACE.json OUT.png

Top: every thread's track, while the worker threads (those that are not a process's
main thread) run. Bottom: the first worker thread's
first top-level slice, zoomed in: its calls nested as their stack was, instants as
ticks, each slice labelled with its arguments where it is wide enough.
"""

from __future__ import annotations

import json
import sys


def read(path):
    """(tracks: {(pid, tid): name}, slices: [(key, name, start, end, depth, args)],
    instants: [(key, name, ts, args)])."""
    events = json.load(open(path))["traceEvents"]
    names, stacks, slices, instants = {}, {}, [], []
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[key] = e["args"]["name"]
        elif e["ph"] == "B":
            stacks.setdefault(key, []).append(e)
        elif e["ph"] == "E":
            stack = stacks[key]
            begin = stack.pop()
            slices.append((key, begin["name"], begin["ts"], e["ts"], len(stack),
                           {**begin.get("args", {}), **e.get("args", {})}))
        elif e["ph"] == "i":
            instants.append((key, e["name"], e["ts"], e.get("args", {})))
    return names, slices, instants


PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1"]
COLORS = {}


def color(name: str):
    return COLORS.setdefault(name, PALETTE[len(COLORS) % len(PALETTE)])


def draw(ax, tracks, slices, instants, start, end, labels):
    row = {key: i for i, key in enumerate(tracks)}
    depth = 1 + max([s[4] for s in slices if s[0] in row] + [0])
    span = end - start
    for key, name, s, e, d, args in slices:
        if key not in row or e < start or s > end:
            continue
        y = row[key] * (depth + 1) + d
        ax.broken_barh([(s, max(e - s, span / 2000))], (y, 0.9), facecolors=color(name),
                       edgecolor="white", linewidth=0.3)
        if labels and (e - s) > span / 14:
            text = name + "(" + ", ".join(str(v) for k, v in args.items()
                                          if k.startswith("arg")) + ")"
            if "return" in args:
                text += f" = {args['return']}"
            ax.text(s + (e - s) / 2, y + 0.45, text, ha="center", va="center", fontsize=7,
                    color="white", clip_on=True)
    for key, name, ts, args in instants:
        if key in row and start <= ts <= end:
            y = row[key] * (depth + 1) + depth - 0.2
            ax.plot([ts], [y], marker="v", markersize=4, color=color(name))
    ax.set_yticks([row[k] * (depth + 1) + depth / 2 for k in tracks])
    ax.set_yticklabels([f"{tracks[k]} {k[1]}" for k in tracks], fontsize=8)
    ax.set_ylim(len(tracks) * (depth + 1) - 0.5, -0.5)
    ax.set_xlim(start, end)
    ax.set_xlabel("time since the first event (µs)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", color="#dddddd", linewidth=0.5)
    ax.set_axisbelow(True)


def main(trace: str, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names, slices, instants = read(trace)
    tracks = dict(sorted(names.items(), key=lambda kv: kv[0][1]))
    pids = {k[0] for k in tracks}
    workers = [k for k in tracks if k[1] not in pids]
    for name in sorted({s[1] for s in slices} | {i[1] for i in instants}):
        color(name)
    # the overview ends with the last worker's last event: a main thread that waits
    # for them (and lingering threads) would squeeze the work into a sliver
    busy = [s for s in slices if s[0] in workers] or slices
    times = [s[2] for s in busy] + [s[3] for s in busy] + [i[2] for i in instants]
    start, end = min(times), max(times)
    end += (end - start) * 0.02
    first = min((s for s in slices if s[4] == 0 and s[0] == (workers or list(tracks))[0]),
                key=lambda s: s[2])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5),
                                      gridspec_kw={"height_ratios": [1.2, 1]})
    draw(top, tracks, slices, instants, start, end, labels=False)
    top.set_title(f"{trace.rsplit('/', 1)[-1]}: one track per thread, while the workers run",
                  fontsize=9)
    margin = (first[3] - first[2]) * 0.02
    draw(bottom, {first[0]: tracks[first[0]]}, slices, instants, first[2] - margin,
         first[3] + margin, labels=True)
    bottom.set_title(f"{tracks[first[0]]}: its {first[1]} call, zoomed in "
                     f"(slices: entry to return; ▼: leaf, probed at entry only)", fontsize=9)
    seen = sorted({s[1] for s in slices} | {i[1] for i in instants})
    fig.legend(handles=[Patch(color=color(n), label=n) for n in seen], loc="upper right",
               fontsize=8, ncol=len(seen))
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
