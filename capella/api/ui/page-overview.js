// Overview: every queue with its size, tiers, rates and last error; the handlers that fail.

import { sparkline } from "./chart.js";
import { failingSince, lastRun } from "./page-handlers.js";
import { ago, bytes, h, link, num, q, rate, section, table, time } from "./dom.js";
import * as sampler from "./sampler.js";

export function tiers(byMark) {
  const entries = Object.entries(byMark || {}).sort(([a], [b]) => Number(a) - Number(b));
  return entries.length ? entries.map(([mark, n]) => `tier ${mark}: ${n}`).join(", ") : "—";
}

// A small chart with its name and latest value above it; several sit side by side in one cell
// and wrap under each other when the window is narrow.
function chart(key, label, format) {
  return h(
    "figure",
    { class: "chart", "data-chart": label },
    h("figcaption", {}, `${label} `, h("strong", {}, format(sampler.last(key)))),
    sparkline(sampler.points(key), { label, format, window: sampler.chartWindow() }),
  );
}

export async function overview(root) {
  if (!sampler.latest.at) await sampler.sample();
  const body = h("div");
  root.append(h("h1", {}, "Overview"), body);

  function refresh() {
    const queues = sampler.latest.queues;
    const failing = sampler.latest.handlers.filter((hd) => failingSince(hd.status) !== null);
    const total = queues.reduce((a, x) => [a[0] + x.stats.messages, a[1] + x.stats.bytes], [0, 0]);
    body.replaceChildren(
      h(
        "div",
        { class: "cards" },
        card("Queues", num(queues.length), "queues"),
        card("Messages", num(total[0]), "messages"),
        card("Bytes", bytes(total[1]), "bytes"),
        card("Failing handlers", num(failing.length), "failing", failing.length ? "bad" : ""),
      ),
      section(
        "Queues",
        table(
          [
            ["Queue", (x) => link(`#/queue/${q(x.name)}`, x.name)],
            ["Messages", (x) => h("span", { class: "n", "data-testid": "messages" }, num(x.stats.messages))],
            ["Bytes", (x) => h("span", { class: "n" }, bytes(x.stats.bytes))],
            ["Blocks by tier", (x) => tiers(x.stats.blocks.by_mark)],
            [
              "Over time",
              (x) =>
                h(
                  "div",
                  { class: "charts" },
                  chart(`produce:${x.name}`, "Produce", rate),
                  chart(`consume:${x.name}`, "Consume", rate),
                  chart(`bytes:${x.name}`, "Size", bytes),
                ),
            ],
            ["Writable", (x) => (x.stats.writable ? "yes" : h("span", { class: "bad" }, "no"))],
            ["Last error", (x) => h("span", { class: x.stats.last_error ? "error" : "muted" }, x.stats.last_error || "none")],
          ],
          queues,
          { empty: "No queues yet.", testid: "queues" },
        ),
        sampler.latest.metrics ? null : h("p", { class: "muted" }, "Consume rates need read access to /metrics (cluster read)."),
      ),
      section(
        "Failing handlers",
        table(
          [
            ["Handler", (x) => x.name],
            ["Type", (x) => x.type],
            ["Error", (x) => h("span", { class: "error" }, x.status.last_error?.message ?? "")],
            ["Failing since", (x) => h("span", { "data-testid": "failing-since", title: time(failingSince(x.status)) }, ago(failingSince(x.status)))],
            ["Last run", (x) => ago(lastRun(x.status))],
          ],
          failing,
          { empty: "No handler is failing.", testid: "failing" },
        ),
      ),
      h("p", { class: "muted" }, `Sampled every ${sampler.interval} s; last sample ${ago(sampler.latest.at)}.`),
    );
  }

  refresh();
  return { refresh };
}

function card(title, value, testid, cls = "") {
  return h("div", { class: `card ${cls}` }, h("div", { class: "muted" }, title), h("div", { class: "big", "data-testid": `card-${testid}` }, value));
}
