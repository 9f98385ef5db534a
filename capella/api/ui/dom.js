// Building the page: every text goes in as a text node (message payloads are untrusted), so
// nothing here ever parses HTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// A table: ``columns`` are [title, row => cell content] pairs. It sits in a box that scrolls
// sideways, so a table wider than a narrow window never spills out of its card.
export function table(columns, rows, { empty = "Nothing here.", testid } = {}) {
  if (!rows.length) return h("p", { class: "muted", "data-testid": testid }, empty);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { "data-testid": testid },
      h("thead", {}, h("tr", {}, columns.map(([title]) => h("th", {}, title)))),
      h(
        "tbody",
        {},
        rows.map((row) => h("tr", {}, columns.map(([, cell]) => h("td", {}, cell(row))))),
      ),
    ),
  );
}

export function section(title, ...children) {
  return h("section", {}, h("h2", {}, title), ...children);
}

// ``risky``: the action deletes something (it asks first); drawn in red outline.
export function button(label, onclick, { allowed = true, why = "", testid, risky = false } = {}) {
  return h(
    "button",
    {
      type: "button",
      class: risky ? "risky" : undefined,
      disabled: !allowed,
      title: allowed ? "" : why || "your rules do not allow this",
      "data-testid": testid,
      onclick: async (event) => {
        const b = event.currentTarget;
        b.disabled = true;
        try {
          await onclick(event);
        } catch (err) {
          notify(err.message, true);
        } finally {
          if (b.isConnected) b.disabled = !allowed;
        }
      },
    },
    label,
  );
}

// Asks before something that cannot be undone: a modal naming what goes, answered true only
// when the user presses ``action``. With ``typed`` the user must first type that name (as
// GitHub asks before deleting a repository). Escape, the dismiss button or a click outside
// answer false.
export function confirmed({ title, text = "", action = "Delete", dismiss = "Cancel", typed = null }) {
  return new Promise((resolve) => {
    const ok = h("button", { type: "button", class: "danger", "data-testid": "confirm-ok", disabled: typed !== null }, action);
    const no = h("button", { type: "button", class: "secondary", "data-testid": "confirm-cancel" }, dismiss);
    const input = typed === null ? null : h("input", { autocomplete: "off", spellcheck: "false", "data-testid": "confirm-typed" });
    const dialog = h(
      "dialog",
      { class: "confirm", "data-testid": "confirm", "aria-label": title },
      h("h2", {}, title),
      text ? h("p", {}, text) : null,
      input ? h("label", {}, h("span", {}, "Type ", h("strong", {}, typed), " to confirm"), input) : null,
      h("p", { class: "actions" }, no, ok),
    );
    const close = (answer) => {
      dialog.returnValue = answer;
      dialog.close();
    };
    ok.addEventListener("click", () => close("ok"));
    no.addEventListener("click", () => close(""));
    dialog.addEventListener("click", (event) => {
      if (event.target === dialog) close(""); // the backdrop
    });
    input?.addEventListener("input", () => {
      ok.disabled = input.value !== typed;
    });
    input?.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && input.value === typed) close("ok");
    });
    dialog.addEventListener("close", () => {
      dialog.remove();
      resolve(dialog.returnValue === "ok");
    });
    document.body.append(dialog);
    dialog.showModal();
    (input || no).focus();
  });
}

export function notify(text, error = false) {
  const box = h("div", { class: error ? "toast error" : "toast", role: "status" }, text);
  document.body.append(box);
  setTimeout(() => box.remove(), error ? 8000 : 3000);
}

export function field(label, input) {
  return h("label", {}, label, " ", input);
}

// --- formats -------------------------------------------------------------------------------

export function num(n) {
  return n === undefined || n === null ? "—" : Number(n).toLocaleString("en-US");
}

export function bytes(n) {
  if (n === undefined || n === null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i ? v.toFixed(1) : v} ${units[i]}`;
}

export function rate(n) {
  if (n === undefined || n === null || Number.isNaN(n)) return "—";
  return `${n < 10 ? n.toFixed(1) : Math.round(n).toLocaleString("en-US")}/s`;
}

export function time(t) {
  if (t === undefined || t === null) return "—";
  return new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function ago(t, now = Date.now() / 1000) {
  if (t === undefined || t === null) return "—";
  const d = now - t;
  const s = Math.abs(d);
  const text = s < 90 ? `${Math.round(s)} s` : s < 5400 ? `${Math.round(s / 60)} min` : s < 172800 ? `${Math.round(s / 3600)} h` : `${Math.round(s / 86400)} d`;
  return d >= 0 ? `${text} ago` : `in ${text}`;
}

// A payload as text for a table cell: the text, or a note for a binary one, cut short.
export function payload(m, max = 120) {
  const text = m.data !== undefined ? m.data : `(binary, ${Math.floor((m.data_b64 || "").length * 0.75)} bytes)`;
  return text.length > max ? text.slice(0, max) + "…" : text;
}

export function headerText(headers) {
  return Object.entries(headers || {})
    .map(([k, v]) => `${k}=${v}`)
    .join(", ");
}

export function link(href, text, testid) {
  return h("a", { href, "data-testid": testid }, text);
}

export function q(name) {
  return encodeURIComponent(name);
}
