// Handlers: state, pass times, last error and counters; start, stop, run now and delete.

import { api, can } from "./api.js";
import { ago, button, bytes, confirmed, h, notify, num, q, section, table, time } from "./dom.js";

export function handlerState(x) {
  if (x.status.running) return "running";
  return x.started ? "started" : "stopped";
}

// The pass times, from the status fields of the API (failing_since, last_run, last_success),
// or worked out from last_complete and last_error when a broker does not send them yet.

// When the current run of failures began; null when the last pass succeeded.
export function failingSince(status) {
  if (status.failing_since !== undefined) return status.failing_since;
  return status.last_error ? status.last_error.time : null;
}

// When the last pass ended, whether it succeeded or failed.
export function lastRun(status) {
  if (status.last_run !== undefined) return status.last_run;
  const times = [status.last_complete, status.last_error?.time].filter((t) => t !== undefined && t !== null);
  return times.length ? Math.max(...times) : null;
}

// When the last successful pass ended.
export function lastSuccess(status) {
  return status.last_success !== undefined ? status.last_success : status.last_complete;
}

export async function handlersPage(root) {
  const body = h("div");
  root.append(h("h1", {}, "Handlers"), section("Handlers", body));

  async function act(name, verb) {
    const answer = await api("POST", `/v1/handlers/${q(name)}/${verb}`);
    const failed = verb === "run" && failingSince(answer.status) !== null;
    notify(failed ? `${name}: the pass failed: ${answer.status.last_error?.message}` : `${name}: ${handlerState(answer)}`, failed);
    await refresh();
  }

  async function drop(x) {
    const sure = await confirmed({
      title: `Delete handler ${x.name}?`,
      text: `The ${x.type} handler stops and its definition is removed. Its queues, their messages and subscriptions stay.`,
    });
    if (!sure) return;
    await api("DELETE", `/v1/handlers/${q(x.name)}`);
    notify(`deleted handler ${x.name}`);
    await refresh();
  }

  async function refresh() {
    const { handlers } = await api("GET", "/v1/handlers");
    body.replaceChildren(
      table(
        [
          ["Handler", (x) => h("span", { "data-testid": "handler-name" }, x.name)],
          ["Type", (x) => x.type],
          ["Queues", (x) => x.queues.join(", ")],
          ["State", (x) => h("span", { class: `state ${handlerState(x)}`, "data-testid": "handler-state" }, handlerState(x))],
          ["Passes", (x) => passes(x.status)],
          [
            "Done",
            (x) =>
              h(
                "div",
                { class: "lines" },
                h("div", {}, h("span", { class: "n", "data-testid": "handler-runs" }, num(x.status.runs)), " runs"),
                h("div", {}, num(x.status.items), " items"),
                h("div", {}, bytes(x.status.bytes)),
              ),
          ],
          ["Lag", (x) => (x.status.lag === undefined ? "—" : num(x.status.lag))],
          [
            "Last error",
            (x) =>
              x.status.last_error
                ? h("span", { class: "error", "data-testid": "handler-error" }, x.status.last_error.message)
                : h("span", { class: "muted" }, "none"),
          ],
          [
            "",
            (x) => {
              const allowed = can("handler", "write", x.name);
              return h(
                "span",
                { class: "actions" },
                x.started
                  ? button("Stop", () => act(x.name, "stop"), { allowed, testid: `stop-${x.name}` })
                  : button("Start", () => act(x.name, "start"), { allowed, testid: `start-${x.name}` }),
                button("Run now", () => act(x.name, "run"), { allowed, testid: `run-${x.name}` }),
                button("Delete", () => drop(x), { allowed: can("handler", "admin", x.name), testid: `delete-${x.name}`, risky: true }),
              );
            },
          ],
        ],
        handlers,
        { empty: "No handlers.", testid: "handlers" },
      ),
    );
  }

  await refresh();
  return { refresh };
}

function passes(status) {
  const since = failingSince(status);
  const line = (title, t, testid, cls = "") => h("div", { class: cls }, `${title} `, h("span", { "data-testid": testid, title: time(t) }, ago(t)));
  return h(
    "div",
    { class: "lines" },
    since !== null ? line("Failing since", since, "handler-failing-since", "error") : null,
    line("Last run", lastRun(status), "handler-last-run"),
    line("Last success", lastSuccess(status), "handler-last-success"),
    line("Next run", status.next_run, "handler-next-run", "muted"),
  );
}
