// Hand-drawn SVG: sparklines of a series over time, and a queue's blocks over its id range.

const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

const FONT = 9; // px, the axis labels (app.css: svg.spark text)
const CHAR = 5.4; // px, about one label character's width at that size

// A series over the last ``window.seconds``: ``points`` are {t, v} (v null for a gap), placed by
// their time, so a gap in sampling shows as a gap. The y axis is labelled with its top and
// bottom (in ``format``'s units), the x axis with the window ("last 5 min") and "now".
export function sparkline(points, { window = { seconds: 300, label: "5 min" }, width = 150, height = 46, label = "", format = String, now = Date.now() / 1000 } = {}) {
  const shown = points.filter((p) => p.v !== null && p.v !== undefined && !Number.isNaN(p.v));
  const ys = shown.map((p) => p.v);
  const lo = Math.min(0, ...ys);
  const hi = ys.length ? Math.max(...ys) : 0;
  const top = format(hi);
  const bottom = format(lo);
  const left = Math.ceil(Math.max(top.length, bottom.length) * CHAR) + 4;
  const plot = { x0: left, x1: width - 2, y0: 4, y1: height - FONT - 4 };
  const root = svg(
    "svg",
    {
      class: "spark",
      width,
      height,
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "data-points": shown.length,
    },
    svg("line", { x1: plot.x0, y1: plot.y0, x2: plot.x0, y2: plot.y1, class: "axis" }),
    svg("line", { x1: plot.x0, y1: plot.y1, x2: plot.x1, y2: plot.y1, class: "axis" }),
    svg("text", { x: left - 3, y: plot.y0 + FONT - 2, "text-anchor": "end", class: "y-max" }, top),
    svg("text", { x: left - 3, y: plot.y1, "text-anchor": "end", class: "y-min" }, bottom),
    svg("text", { x: plot.x0, y: height - 2, class: "x-window" }, `last ${window.label}`),
    svg("text", { x: plot.x1, y: height - 2, "text-anchor": "end", class: "x-now" }, "now"),
  );
  if (shown.length < 2) {
    root.append(svg("title", {}, `${label}: collecting samples`));
    return root;
  }
  const from = now - window.seconds;
  const span = hi - lo || 1;
  const xy = shown.map((p) => [
    (plot.x0 + ((p.t - from) / window.seconds) * (plot.x1 - plot.x0)).toFixed(1),
    (plot.y1 - ((p.v - lo) / span) * (plot.y1 - plot.y0)).toFixed(1),
  ]);
  const line = xy.map(([x, y], i) => `${i ? "L" : "M"}${x},${y}`).join("");
  const area = `${line}L${xy[xy.length - 1][0]},${plot.y1}L${xy[0][0]},${plot.y1}Z`;
  root.append(
    svg("title", {}, `${label} over the last ${window.label}: now ${format(ys[ys.length - 1])}, max ${format(hi)}, min ${format(Math.min(...ys))}`),
    svg("path", { d: area, class: "area" }),
    svg("path", { d: line, class: "line" }),
  );
  return root;
}

// The blocks as rectangles over the id range [first, last], coloured by their mark (tier);
// open and sealing blocks hatched.
export function blockBar(blocks, first, last, { width = 800, height = 34 } = {}) {
  const root = svg("svg", {
    class: "blocks",
    viewBox: `0 0 ${width} ${height}`,
    preserveAspectRatio: "none",
    role: "img",
    "data-blocks": blocks.length,
  });
  const lo = Math.min(first, ...blocks.map((b) => b.first_id));
  const hi = Math.max(last, ...blocks.map((b) => b.last_id));
  const span = Math.max(hi - lo + 1, 1);
  root.append(svg("rect", { x: 0, y: 0, width, height, class: "gap" }));
  for (const b of blocks) {
    const x = ((b.first_id - lo) / span) * width;
    const w = Math.max(((b.last_id - b.first_id + 1) / span) * width, 1.5);
    const cls = b.state === "sealed" ? `tier tier${b.mark % 6}` : `tier ${b.state}`;
    const rect = svg("rect", { x: x.toFixed(2), y: 2, width: w.toFixed(2), height: height - 4, class: cls });
    rect.append(
      svg("title", {}, `ids ${b.first_id}–${b.last_id}: ${b.count} messages, ${b.bytes} bytes, ${b.state}, tier ${b.mark}`),
    );
    root.append(rect);
  }
  return root;
}

export function swatch(mark, state = "sealed") {
  const cls = state === "sealed" ? `tier tier${mark % 6}` : `tier ${state}`;
  return svg("svg", { width: 12, height: 12, class: "swatch" }, svg("rect", { x: 0, y: 0, width: 12, height: 12, class: cls }));
}
