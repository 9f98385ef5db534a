// Work queues (ack-mode subscriptions): counts by state, and one work queue's messages with
// their attempts and last error, with links to its queue and dead-letter queue; retry a failed
// one, move a dead one back, or delete one (after asking).

import { api, can } from "./api.js";
import { ago, button, confirmed, h, link, notify, num, payload, q, section, table } from "./dom.js";

const STATUSES = ["pending", "in_flight", "failed", "dead"];

export async function workPage(root, [queue, name]) {
  return queue && name ? drill(root, queue, name) : list(root);
}

async function list(root) {
  const body = h("div");
  root.append(h("h1", {}, "Work queues"), body);

  async function refresh() {
    const { queues } = await api("GET", "/v1/queues");
    const rows = [];
    for (const x of queues.filter((x) => x.stats.subscriptions > 0)) {
      const { subscriptions } = await api("GET", `/v1/queues/${q(x.name)}/subscriptions`);
      for (const s of subscriptions) if (s.mode === "ack") rows.push({ queue: x.name, ...s });
    }
    body.replaceChildren(
      table(
        [
          ["Queue", (x) => x.queue],
          ["Subscription", (x) => link(`#/work/${q(x.queue)}/${q(x.name)}`, x.name)],
          ["Pending", (x) => count(x.work.backlog, "pending")],
          ["In flight", (x) => count(x.work.in_flight, "in_flight")],
          ["Failed", (x) => count(x.work.failed, "failed")],
          ["Dead", (x) => count(x.work.dead, "dead")],
          ["Finished up to", (x) => num(x.last_id)],
          ["Max attempts", (x) => (x.policy.max_attempts ? num(x.policy.max_attempts) : "no limit")],
          ["Dead letters to", (x) => (x.policy.dead_letter ? link(`#/queue/${q(x.policy.dead_letter)}`, x.policy.dead_letter, "dead-letter-link") : "—")],
        ],
        rows,
        { empty: "No work queues (ack-mode subscriptions).", testid: "work-queues" },
      ),
      h("p", { class: "muted" }, "Pending counts the messages after the highest one ever claimed; failed ones wait for their retry."),
    );
  }

  await refresh();
  return { refresh };
}

function count(n, testid) {
  return h("span", { class: n && (testid === "dead" || testid === "failed") ? "n bad" : "n", "data-testid": `count-${testid}` }, num(n));
}

async function drill(root, queue, name) {
  const base = `/v1/queues/${q(queue)}/subscriptions/${q(name)}`;
  const admin = can("subscription", "admin", `${queue}/${name}`);
  const boxes = STATUSES.map((s) => h("input", { type: "checkbox", name: s, checked: s !== "pending", "data-testid": `status-${s}` }));
  const counts = h("p", { "data-testid": "work-counts" });
  const policy = h("p", { class: "muted" });
  const body = h("div");
  root.append(
    h("h1", {}, "Work queue ", h("span", {}, `${queue} / ${name}`)),
    counts,
    policy,
    section(
      "Messages",
      h(
        "div",
        { class: "form" },
        boxes.map((b) => h("label", {}, b, " ", b.name.replace("_", " "))),
        button("Show", () => refresh(), { testid: "work-show" }),
      ),
      admin ? null : h("p", { class: "muted" }, "Retry and delete need subscription admin."),
      body,
    ),
  );

  async function remove(m) {
    const sure = await confirmed({
      title: `Delete message ${m.id} from ${queue} / ${name}?`,
      text: "It is finished without being processed: no consumer gets it again. The message stays in the queue's log.",
    });
    if (sure) await act("delete", [m.id]);
  }

  async function act(verb, ids) {
    const answer = await api("POST", `${base}/work/${verb}`, { body: { ids } });
    const done = answer[verb === "retry" ? "retried" : "deleted"];
    notify(`${verb === "retry" ? "retried" : "deleted"}: ${done.length ? done.join(", ") : "nothing"}`);
    await refresh();
  }

  async function refresh() {
    const sub = await api("GET", base);
    const w = sub.work;
    const dead = sub.policy.dead_letter;
    policy.replaceChildren(
      "Messages from queue ",
      link(`#/queue/${q(queue)}`, queue, "queue-link"),
      `; ${sub.policy.max_attempts ? `${num(sub.policy.max_attempts)} attempts` : "no attempt limit"}, then `,
      dead ? h("span", {}, "dead letters go to ", link(`#/queue/${q(dead)}`, dead, "dead-letter-link")) : "they stay here as dead",
      ".",
    );
    counts.textContent = `pending ${num(w.backlog)}, in flight ${num(w.in_flight)}, failed ${num(w.failed)}, dead ${num(w.dead)}`;
    const status = boxes.filter((b) => b.checked).map((b) => b.name).join(",");
    const { messages } = status ? await api("GET", `${base}/work`, { query: { status, limit: 100 } }) : { messages: [] };
    body.replaceChildren(
      table(
        [
          ["Id", (m) => h("span", { "data-testid": "work-id" }, m.id)],
          ["Status", (m) => h("span", { class: `state ${m.status}`, "data-testid": "work-status" }, m.status.replace("_", " "))],
          ["Attempts", (m) => h("span", { class: "n", "data-testid": "work-attempts" }, m.attempts)],
          ["Last error", (m) => h("span", { class: m.last_error ? "error" : "muted", "data-testid": "work-error" }, m.last_error || "none")],
          ["When", (m) => (m.lease_until ? `lease ends ${ago(m.lease_until)}` : m.retry_at ? `retry ${ago(m.retry_at)}` : m.died ? `died ${ago(m.died)}` : "—")],
          ["Source", (m) => m.source],
          ["Payload", (m) => h("span", { class: "payload" }, payload(m))],
          [
            "",
            (m) =>
              h(
                "span",
                { class: "actions" },
                m.status === "failed" ? button("Retry now", () => act("retry", [m.id]), { allowed: admin, testid: `retry-${m.id}` }) : null,
                m.status === "dead" ? button("Move back", () => act("retry", [m.id]), { allowed: admin, testid: `moveback-${m.id}` }) : null,
                button("Delete", () => remove(m), { allowed: admin, testid: `delete-${m.id}`, risky: true }),
              ),
          ],
        ],
        messages,
        { empty: "No message in these states.", testid: "work-messages" },
      ),
    );
  }

  await refresh();
  return { refresh };
}
