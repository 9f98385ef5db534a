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

// A table: ``columns`` are [title, row => cell content] pairs.
export function table(columns, rows, { empty = "Nothing here.", testid } = {}) {
  if (!rows.length) return h("p", { class: "muted", "data-testid": testid }, empty);
  return h(
    "table",
    { "data-testid": testid },
    h("thead", {}, h("tr", {}, columns.map(([title]) => h("th", {}, title)))),
    h(
      "tbody",
      {},
      rows.map((row) => h("tr", {}, columns.map(([, cell]) => h("td", {}, cell(row))))),
    ),
  );
}

export function section(title, ...children) {
  return h("section", {}, h("h2", {}, title), ...children);
}

export function button(label, onclick, { allowed = true, why = "", testid } = {}) {
  return h(
    "button",
    {
      type: "button",
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

export function link(href, text) {
  return h("a", { href }, text);
}

export function q(name) {
  return encodeURIComponent(name);
}
