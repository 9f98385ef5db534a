// Replication: external clusters with their ping (and delete, after asking), copy handlers with their lag over
// time, and which replica subscriptions hold a message (its receipts).

import { api, can } from "./api.js";
import { sparkline } from "./chart.js";
import { button, confirmed, field, h, notify, num, q, section, table } from "./dom.js";
import { handlerState } from "./page-handlers.js";
import * as sampler from "./sampler.js";

export async function replicationPage(root) {
  const clusterList = h("div");
  const copies = h("div");
  root.append(
    h("h1", {}, "Replication"),
    section("External clusters", clusterList),
    section("Copy handlers", copies),
    await replicasSection(),
  );
  const pings = new Map(); // cluster name -> the last ping answer, or an error text

  async function ping(name) {
    try {
      pings.set(name, await api("POST", `/v1/clusters/${q(name)}/ping`));
    } catch (err) {
      pings.set(name, { ok: false, error: { code: err.code, message: err.message } });
    }
  }

  function pingText(name) {
    const p = pings.get(name);
    if (!p) return h("span", { class: "muted" }, "not pinged");
    if (p.ok) return h("span", { class: "good", "data-testid": "ping" }, `ok, ${p.latency_ms.toFixed(1)} ms${p.ready ? "" : " (recovering)"}`);
    return h("span", { class: "error", "data-testid": "ping" }, `${p.error.code}: ${p.error.message}`);
  }

  let clusters = [];

  async function dropCluster(name) {
    const sure = await confirmed({
      title: `Delete the link to ${name}?`,
      text: "Its URL and credentials are removed. The broker refuses while a handler still uses it.",
    });
    if (!sure) return;
    await api("DELETE", `/v1/clusters/${q(name)}`);
    notify(`deleted link ${name}`);
    ({ clusters } = await api("GET", "/v1/clusters"));
    drawClusters();
  }

  function drawClusters() {
    clusterList.replaceChildren(
      table(
        [
          ["Cluster", (x) => h("span", { "data-testid": "cluster-name" }, x.name)],
          ["URL", (x) => x.url],
          ["Credentials", (x) => (x.credentials ? `${x.credentials.kind} (${x.credentials.source})` : "none")],
          ["Compression", (x) => x.compression],
          ["Ping", (x) => pingText(x.name)],
          [
            "",
            (x) =>
              h(
                "span",
                { class: "actions" },
                button(
                  "Ping",
                  async () => {
                    await ping(x.name);
                    drawClusters();
                  },
                  { allowed: can("external_cluster", "write", x.name), testid: `ping-${x.name}` },
                ),
                button("Delete", () => dropCluster(x.name), { allowed: can("external_cluster", "admin", x.name), testid: `delete-link-${x.name}`, risky: true }),
              ),
          ],
        ],
        clusters,
        { empty: "No links to other clusters.", testid: "links" },
      ),
    );
  }

  function drawCopies() {
    const handlers = sampler.latest.handlers.filter((x) => x.type === "copy");
    copies.replaceChildren(
      table(
        [
          ["Handler", (x) => x.name],
          ["From", (x) => x.queues.join(", ")],
          ["To", (x) => String(x.params.to ?? "—")],
          ["State", (x) => handlerState(x)],
          ["Lag", (x) => h("span", { class: "n", "data-testid": "copy-lag" }, x.status.lag === undefined ? "—" : num(x.status.lag))],
          ["Lag over time", (x) => sparkline(sampler.points(`copylag:${x.name}`), { width: 180, height: 46, label: "lag", format: num, window: sampler.chartWindow() })],
          ["By queue", (x) => Object.entries(x.status.lag_by_queue || {}).map(([k, v]) => `${k}: ${v}`).join(", ")],
          ["Last error", (x) => (x.status.last_error ? h("span", { class: "error" }, x.status.last_error.message) : h("span", { class: "muted" }, "none"))],
        ],
        handlers,
        { empty: "No copy handlers.", testid: "copies" },
      ),
    );
  }

  ({ clusters } = await api("GET", "/v1/clusters"));
  if (!sampler.latest.at) await sampler.sample();
  drawClusters();
  drawCopies();
  // Ping every external cluster once when the page opens (those the user may ping), then on request.
  Promise.all(clusters.filter((x) => can("external_cluster", "write", x.name)).map((x) => ping(x.name))).then(drawClusters);
  return { refresh: drawCopies };
}

async function replicasSection() {
  const { queues } = await api("GET", "/v1/queues");
  const queue = h("select", { name: "queue", "data-testid": "replicas-queue" }, queues.map((x) => h("option", { value: x.name }, x.name)));
  const id = h("input", { name: "id", type: "number", min: 1, placeholder: "message id", "data-testid": "replicas-id" });
  const out = h("p", { "data-testid": "replicas-result" });
  const look = button(
    "Show replicas",
    async () => {
      const r = await api("GET", `/v1/queues/${q(queue.value)}/replicas`, { query: { id: id.value } });
      out.textContent = r.count
        ? `message ${r.id} of ${queue.value} is held by ${r.count} replica subscription(s): ${r.subscriptions.join(", ")}`
        : `message ${r.id} of ${queue.value} has no replica yet`;
    },
    { testid: "replicas-go" },
  );
  return section(
    "A message's replicas",
    h("p", { class: "muted" }, "Replica subscriptions (copy handlers' cursors) at or past the message: its receipts."),
    h("div", { class: "form" }, field("Queue", queue), field("Id", id), look),
    out,
  );
}
