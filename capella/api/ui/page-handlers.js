// Handlers: state, last run, last error and counters; start, stop and run now.

import { api, can } from "./api.js";
import { ago, button, bytes, h, notify, num, q, section, table } from "./dom.js";

export function handlerState(x) {
  if (x.status.running) return "running";
  return x.started ? "started" : "stopped";
}

export async function handlersPage(root) {
  const body = h("div");
  root.append(h("h1", {}, "Handlers"), section("Handlers", body));

  async function act(name, verb) {
    const answer = await api("POST", `/v1/handlers/${q(name)}/${verb}`);
    const error = answer.status.last_error;
    notify(verb === "run" && error ? `${name}: the pass failed: ${error.message}` : `${name}: ${handlerState(answer)}`, verb === "run" && !!error);
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
          ["Last run", (x) => ago(x.status.last_complete)],
          ["Next run", (x) => ago(x.status.next_run)],
          ["Runs", (x) => h("span", { class: "n", "data-testid": "handler-runs" }, num(x.status.runs))],
          ["Items", (x) => num(x.status.items)],
          ["Bytes", (x) => bytes(x.status.bytes)],
          ["Lag", (x) => (x.status.lag === undefined ? "—" : num(x.status.lag))],
          [
            "Last error",
            (x) =>
              x.status.last_error
                ? h("span", { class: "error", "data-testid": "handler-error" }, `${x.status.last_error.message} (${ago(x.status.last_error.time)})`)
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
