// Hand-drawn SVG: sparklines of a series over time, and a queue's blocks over its id range.

const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// ``values``: numbers (null for a gap). The title shows the last value and the range.
export function sparkline(values, { width = 120, height = 28, label = "", format = String } = {}) {
  const points = values.map((v, i) => [i, v]).filter(([, v]) => v !== null && v !== undefined && !Number.isNaN(v));
  const root = svg("svg", {
    class: "spark",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "data-points": points.length,
  });
  if (points.length < 2) {
    root.append(svg("title", {}, `${label}: collecting samples`));
    root.append(svg("line", { x1: 0, y1: height - 1, x2: width, y2: height - 1, class: "axis" }));
    return root;
  }
  const ys = points.map(([, v]) => v);
  const lo = Math.min(0, ...ys);
  const hi = Math.max(...ys);
  const span = hi - lo || 1;
  const n = Math.max(values.length - 1, 1);
  const xy = points.map(([i, v]) => [
    ((i / n) * (width - 2) + 1).toFixed(1),
    (height - 2 - ((v - lo) / span) * (height - 4)).toFixed(1),
  ]);
  const line = xy.map(([x, y], i) => `${i ? "L" : "M"}${x},${y}`).join("");
  const area = `${line}L${xy[xy.length - 1][0]},${height - 1}L${xy[0][0]},${height - 1}Z`;
  root.append(
    svg("title", {}, `${label}: now ${format(ys[ys.length - 1])}, max ${format(hi)}, min ${format(Math.min(...ys))}`),
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
