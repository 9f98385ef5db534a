// One queue: its latest messages, its blocks over the id range by tier, subscriptions with lag
// (an ack one links to its work queue and dead-letter queue), a live tail, a test message,
// finding messages by id range, source, segment, header or JSON field; deleting (after asking).

import { api, can, tail } from "./api.js";
import { blockBar, sparkline, swatch } from "./chart.js";
import { ago, button, bytes, confirmed, field, h, headerText, link, notify, num, payload, q, rate, section, table, time } from "./dom.js";
import * as sampler from "./sampler.js";

const TAIL_KEEP = 50;
const LATEST = 20; // messages shown when the page opens, newest first
const FIND_PAGE = 1000; // messages per read while finding
const FIND_REQUESTS = 10; // reads one Find makes (the server looks at up to 100,000 each) before it offers to go on

export async function queuePage(root, [name]) {
  const path = `/v1/queues/${q(name)}`;
  const info = await api("GET", path);
  const stats = h("div");
  const latest = h("div");
  const blocks = h("div");
  const subs = h("div");
  const drop = button("Delete queue", () => dropQueue(name), { allowed: can("queue", "admin", name), testid: "delete-queue", risky: true });
  root.append(
    h("div", { class: "title" }, h("h1", {}, "Queue ", h("span", { "data-testid": "queue-name" }, name)), drop),
    stats,
    section(`Latest ${LATEST} messages`, latest),
    section("Blocks by tier over the id range", blocks),
    section("Subscriptions", subs),
  );
  let latestFor = null; // the last id the latest messages were read at

  async function dropSubscription(sub) {
    const sure = await confirmed({
      title: `Delete subscription ${sub.name} of ${name}?`,
      text: `Its cursor (at id ${num(sub.last_id)})${sub.mode === "ack" ? ", leases, attempts and failures" : ""} are removed; the queue's messages stay.`,
    });
    if (!sure) return;
    await api("DELETE", `${path}/subscriptions/${q(sub.name)}`);
    notify(`deleted subscription ${name}/${sub.name}`);
    await refresh();
  }
  const stopTail = tailSection(root, name, info.stats.last_id);
  root.append(produceSection(name), findSection(name));

  async function refresh() {
    const [queue, blockList, subList] = await Promise.all([
      api("GET", path),
      api("GET", `${path}/blocks`, { query: { limit: 1000 } }),
      api("GET", `${path}/subscriptions`),
    ]);
    const s = queue.stats;
    stats.replaceChildren(
      h(
        "dl",
        { class: "facts", "data-testid": "queue-stats" },
        fact("Messages", num(s.messages), "messages"),
        fact("Bytes", bytes(s.bytes), "bytes"),
        fact("Ids", `${num(s.first_id)} – ${num(s.last_id)}`, "ids"),
        fact("Scheduled", num(s.scheduled.count), "scheduled"),
        fact("Writable", s.writable ? "yes" : "no", "writable"),
        fact("Last error", s.last_error || "none", "last-error"),
      ),
      h(
        "div",
        { class: "charts" },
        chart("Messages", `messages:${name}`, num),
        chart("Bytes", `bytes:${name}`, bytes),
        chart("Produce", `produce:${name}`, rate),
        chart("Consume", `consume:${name}`, rate),
      ),
    );
    if (s.last_id !== latestFor) {
      latest.replaceChildren(await latestView(name, s));
      latestFor = s.last_id;
    }
    blocks.replaceChildren(...blockView(blockList, s).filter(Boolean));
    const now = Date.now() / 1000;
    for (const sub of subList.subscriptions) sampler.record(`lag:${name}/${sub.name}`, sub.lag, now);
    subs.replaceChildren(
      table(
        [
          ["Subscription", (x) => x.name],
          ["Mode", (x) => (x.mode === "ack" ? h("span", {}, "ack: ", link(`#/work/${q(name)}/${q(x.name)}`, "work queue", "work-link")) : x.mode)],
          ["Dead letters to", (x) => (x.policy?.dead_letter ? link(`#/queue/${q(x.policy.dead_letter)}`, x.policy.dead_letter, "dead-letter-link") : "—")],
          ["Last id", (x) => num(x.last_id)],
          ["Lag", (x) => h("span", { class: "n", "data-testid": "lag" }, num(x.lag))],
          ["Lag over time", (x) => sparkline(sampler.points(`lag:${name}/${x.name}`), { label: "lag", format: num, window: sampler.chartWindow() })],
          ["Replica", (x) => (x.replica ? "yes" : "no")],
          ["Updated", (x) => ago(x.updated)],
          [
            "",
            (x) =>
              button("Delete", () => dropSubscription(x), {
                allowed: can("subscription", "admin", `${name}/${x.name}`),
                testid: `delete-subscription-${x.name}`,
                risky: true,
              }),
          ],
        ],
        subList.subscriptions,
        { empty: "No subscriptions.", testid: "subscriptions" },
      ),
    );
  }

  await refresh();
  return { refresh, stop: stopTail };
}

function fact(title, value, testid) {
  return h("div", {}, h("dt", {}, title), h("dd", { "data-testid": `stat-${testid}` }, value));
}

function chart(title, key, format) {
  return h(
    "figure",
    { "data-chart": title },
    h("figcaption", {}, `${title}: `, h("strong", {}, format(sampler.last(key)))),
    sparkline(sampler.points(key), { width: 220, height: 64, label: title, format, window: sampler.chartWindow() }),
  );
}

// Deleting a queue loses its messages: the user types its name first.
async function dropQueue(name) {
  const sure = await confirmed({
    title: `Delete queue ${name}?`,
    text: "Its messages, blocks, subscriptions and scheduled messages are deleted for good.",
    action: "Delete queue",
    typed: name,
  });
  if (!sure) return;
  await api("DELETE", `/v1/queues/${q(name)}`);
  notify(`deleted queue ${name}`);
  location.hash = "#/";
}

// The newest messages first, read as one page after (last id - LATEST).
async function latestView(name, s) {
  const after = Math.max(s.first_id - 1, s.last_id - LATEST, 0);
  const page = s.messages ? await api("GET", `/v1/queues/${q(name)}/messages`, { query: { after, limit: LATEST } }) : { messages: [] };
  return table(
    [
      ["Id", (m) => m.id],
      ["Time", (m) => time(m.time)],
      ["Source", (m) => m.source],
      ["Segment", (m) => m.segment],
      ["Headers", (m) => headerText(m.headers)],
      ["Payload", (m) => h("span", { class: "payload" }, payload(m))],
    ],
    page.messages.reverse(),
    { empty: "No messages yet.", testid: "latest" },
  );
}

function blockView(list, s) {
  const byTier = new Map();
  for (const b of list.blocks) {
    const key = b.state === "sealed" ? `tier ${b.mark}` : b.state;
    const t = byTier.get(key) || { key, mark: b.mark, state: b.state, blocks: 0, messages: 0, bytes: 0 };
    t.blocks += 1;
    t.messages += b.count;
    t.bytes += b.bytes;
    byTier.set(key, t);
  }
  const rows = [...byTier.values()];
  return [
    list.blocks.length ? blockBar(list.blocks, s.first_id, s.last_id) : h("p", { class: "muted" }, "No blocks: the queue is empty."),
    list.blocks.length ? h("div", { class: "axis-labels" }, h("span", {}, `id ${num(list.blocks[0].first_id)}`), h("span", {}, `id ${num(list.blocks[list.blocks.length - 1].last_id)}`)) : null,
    list.next_after !== null ? h("p", { class: "muted" }, `Showing the first ${list.blocks.length} blocks.`) : null,
    table(
      [
        ["Tier", (x) => h("span", {}, swatch(x.mark, x.state), " ", x.key)],
        ["Blocks", (x) => h("span", { class: "n", "data-testid": "tier-blocks" }, num(x.blocks))],
        ["Messages", (x) => num(x.messages)],
        ["Bytes", (x) => bytes(x.bytes)],
      ],
      rows,
      { empty: "", testid: "tiers" },
    ),
  ];
}

// --- live tail -----------------------------------------------------------------------------

function tailSection(root, name, lastId) {
  const state = h("span", { class: "muted", "data-testid": "tail-state" }, "stopped");
  const list = h("tbody", { "data-testid": "tail" });
  let stop = null;
  const toggle = h("button", { type: "button", "data-testid": "tail-toggle" }, "Start");
  toggle.addEventListener("click", () => {
    if (stop) {
      stop();
      stop = null;
      toggle.textContent = "Start";
      state.textContent = "stopped";
      return;
    }
    toggle.textContent = "Stop";
    state.textContent = "connecting";
    // The last ten messages first, then whatever arrives.
    stop = tail(
      name,
      Math.max(0, lastId - 10),
      (m) => {
        list.prepend(h("tr", { "data-id": m.id }, h("td", {}, m.id), h("td", {}, time(m.time)), h("td", {}, m.source), h("td", {}, m.segment), h("td", { class: "payload" }, payload(m))));
        while (list.children.length > TAIL_KEEP) list.lastChild.remove();
      },
      (text) => {
        state.textContent = text;
      },
    );
  });
  root.append(
    section(
      "Live tail",
      h("p", {}, toggle, " ", state),
      h("table", {}, h("thead", {}, h("tr", {}, ["Id", "Time", "Source", "Segment", "Payload"].map((t) => h("th", {}, t)))), list),
    ),
  );
  return () => stop?.();
}

// --- produce a test message ----------------------------------------------------------------

export function parsePairs(text) {
  const pairs = {};
  for (const line of text.split(/[\n,]/)) {
    const at = line.indexOf("=");
    if (line.trim() === "") continue;
    if (at <= 0) throw new Error(`expected name=value, got ${JSON.stringify(line.trim())}`);
    pairs[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return pairs;
}

function produceSection(name) {
  const allowed = can("queue", "write", name);
  const data = h("textarea", { name: "data", rows: 3, "data-testid": "produce-data", disabled: !allowed }, '{"hello": "world"}');
  const source = h("input", { name: "source", placeholder: "the cluster's name", "data-testid": "produce-source", disabled: !allowed });
  const segment = h("input", { name: "segment", type: "number", placeholder: "0", disabled: !allowed });
  const headers = h("input", { name: "headers", placeholder: "kind=test, team=ops", "data-testid": "produce-headers", disabled: !allowed });
  const result = h("p", { "data-testid": "produce-result" });
  const send = button(
    "Send",
    async () => {
      const message = { data: data.value };
      if (source.value.trim()) message.source = source.value.trim();
      if (segment.value.trim()) message.segment = Number(segment.value);
      const hd = parsePairs(headers.value);
      if (Object.keys(hd).length) message.headers = hd;
      const answer = await api("POST", `/v1/queues/${q(name)}/messages`, { body: { messages: [message] } });
      const r = answer.results[0];
      result.textContent = `stored as id ${r.id}${r.duplicate ? " (duplicate)" : ""}`;
      notify(result.textContent);
    },
    { allowed, testid: "produce-send" },
  );
  return section(
    "Produce a test message",
    allowed ? null : h("p", { class: "muted" }, "Your rules do not allow writing to this queue."),
    h("div", { class: "form" }, field("Payload", data), field("Source", source), field("Segment", segment), field("Headers", headers), send),
    result,
  );
}

// --- find messages -------------------------------------------------------------------------

// The read API filters by source, segments, header and JSON field itself; the page only asks
// for a page at a time and keeps the range. One Find makes at most FIND_REQUESTS reads.
function findSection(name) {
  const input = (n, placeholder, type = "text") => h("input", { name: n, placeholder, type, "data-testid": `find-${n}` });
  const from = input("from", "1", "number");
  const to = input("to", "last", "number");
  const source = input("source", "any");
  const segments = input("segments", "0-9,42");
  const header = input("header", "kind=test");
  const json = input("json", "customer.id=42");
  const limit = input("limit", "50", "number");
  const status = h("p", { class: "muted", "data-testid": "find-status" });
  const results = h("div");
  let resume = null;

  async function run(after) {
    status.textContent = "searching…";
    results.replaceChildren();
    const want = Number(limit.value) || 50;
    const end = to.value.trim() ? Number(to.value) : Infinity;
    // One JSON field, split at its first "=": the value may hold commas ([1, 2]) and "=".
    const pair = json.value.trim();
    const at = pair.indexOf("=");
    if (pair && at <= 0) throw new Error(`JSON field: expected path=value, got ${JSON.stringify(pair)}`);
    const query = { source: source.value.trim(), segments: segments.value.trim() };
    if (pair) query[`json.${pair.slice(0, at).trim()}`] = pair.slice(at + 1).trim();
    for (const [k, v] of Object.entries(parsePairs(header.value))) query[`header.${k}`] = v;
    const found = [];
    let cursor = after;
    let done = false;
    for (let requests = 0; found.length < want && requests < FIND_REQUESTS; requests += 1) {
      const page = await api("GET", `/v1/queues/${q(name)}/messages`, {
        query: { ...query, after: cursor, limit: Math.min(want - found.length, FIND_PAGE) },
      });
      for (const m of page.messages) {
        if (m.id > end) {
          done = true;
          break;
        }
        found.push(m);
      }
      // The server says how far it looked, also past messages that did not match.
      if (done || page.last_id <= cursor || page.last_id >= end) {
        done = true;
        break;
      }
      cursor = page.last_id;
    }
    resume = done ? null : cursor;
    status.textContent = `${found.length} found after id ${num(after)}${done ? ", to the end of the range" : `; looked up to id ${num(cursor)}`}.`;
    more.hidden = resume === null;
    results.replaceChildren(
      table(
        [
          ["Id", (m) => m.id],
          ["Time", (m) => time(m.time)],
          ["Source", (m) => m.source],
          ["External id", (m) => m.external_id],
          ["Segment", (m) => m.segment],
          ["Headers", (m) => headerText(m.headers)],
          ["Payload", (m) => h("span", { class: "payload" }, payload(m, 300))],
        ],
        found,
        { empty: "No message matches.", testid: "find-results" },
      ),
    );
  }

  const go = button("Find", () => run(Math.max(0, (Number(from.value) || 1) - 1)), { testid: "find-go" });
  const more = button("Go on", () => run(resume), { testid: "find-more" });
  more.hidden = true;
  return section(
    "Find messages",
    h(
      "div",
      { class: "form" },
      field("From id", from),
      field("To id", to),
      field("Source", source),
      field("Segments", segments),
      field("Header", header),
      field("JSON field", json),
      field("At most", limit),
      go,
      more,
    ),
    status,
    results,
  );
}
