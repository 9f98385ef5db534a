// Scheduled (delayed) messages: what falls due next across the queues, and cancel (after asking).

import { api, can } from "./api.js";
import { ago, button, confirmed, h, headerText, notify, num, payload, q, section, table, time } from "./dom.js";

const SHOWN = 50;

export async function scheduledPage(root) {
  const summary = h("div");
  const body = h("div");
  root.append(h("h1", {}, "Scheduled"), summary, section("Falling due next", body));

  async function cancel(queue, id) {
    const sure = await confirmed({
      title: `Cancel scheduled message ${id} of ${queue}?`,
      text: "It is deleted and never enters the queue.",
      action: "Cancel message",
      dismiss: "Keep it",
    });
    if (!sure) return;
    await api("DELETE", `/v1/queues/${q(queue)}/scheduled/${id}`);
    notify(`cancelled ${queue} #${id}`);
    await refresh();
  }

  async function refresh() {
    const { queues } = await api("GET", "/v1/queues");
    const withSchedule = queues.filter((x) => x.stats.scheduled.count > 0);
    const pages = await Promise.all(
      withSchedule.map((x) => api("GET", `/v1/queues/${q(x.name)}/scheduled`, { query: { limit: SHOWN } })),
    );
    const rows = pages
      .flatMap((page, i) => page.scheduled.map((m) => ({ queue: withSchedule[i].name, ...m })))
      .sort((a, b) => a.deliver_at - b.deliver_at || a.scheduled_id - b.scheduled_id)
      .slice(0, SHOWN);
    summary.replaceChildren(
      table(
        [
          ["Queue", (x) => x.name],
          ["Scheduled", (x) => h("span", { class: "n", "data-testid": "scheduled-count" }, num(x.stats.scheduled.count))],
          ["Next due", (x) => `${time(x.stats.scheduled.next_due)} (${ago(x.stats.scheduled.next_due)})`],
        ],
        withSchedule,
        { empty: "Nothing is scheduled.", testid: "scheduled-queues" },
      ),
    );
    body.replaceChildren(
      table(
        [
          ["Due", (m) => time(m.deliver_at)],
          ["In", (m) => ago(m.deliver_at)],
          ["Queue", (m) => m.queue],
          ["Scheduled id", (m) => h("span", { "data-testid": "scheduled-id" }, m.scheduled_id)],
          ["Source", (m) => m.source],
          ["Headers", (m) => headerText(m.headers)],
          ["Payload", (m) => h("span", { class: "payload" }, payload(m))],
          ["", (m) => button("Cancel", () => cancel(m.queue, m.scheduled_id), { allowed: can("queue", "write", m.queue), testid: `cancel-${m.scheduled_id}`, risky: true })],
        ],
        rows,
        { empty: "Nothing is scheduled.", testid: "scheduled" },
      ),
    );
  }

  await refresh();
  return { refresh };
}
