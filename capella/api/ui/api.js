// The API as the console calls it: the signed-in user's credentials, JSON in and out, the
// caller's rules (GET /v1/me) to hide what they may not do, and the SSE tail read with fetch
// (EventSource cannot send an Authorization header).

const KEY = "capella.auth";

export const session = {
  auth: sessionStorage.getItem(KEY), // "Bearer <token>", or null
  tokenId: sessionStorage.getItem(KEY + ".id"),
  me: null, // the answer of GET /v1/me
  onUnauthorized: () => {},
};

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function url(path, query = {}) {
  const u = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query)) {
    if (v !== undefined && v !== null && v !== "") u.searchParams.append(k, String(v));
  }
  return u;
}

function headers(extra = {}) {
  // Answered 401 with a Bearer challenge only: no browser password prompt over the page.
  const h = { "X-Requested-With": "XMLHttpRequest", ...extra };
  if (session.auth && !h.Authorization) h.Authorization = session.auth;
  return h;
}

async function decoded(resp) {
  const text = await resp.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

export async function api(method, path, { query, body, auth } = {}) {
  const init = { method, headers: headers(auth ? { Authorization: auth } : {}) };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(url(path, query), init);
  const data = await decoded(resp);
  if (!resp.ok) {
    const error = data && data.error ? data.error : {};
    if (resp.status === 401 && !auth) session.onUnauthorized();
    throw new ApiError(resp.status, error.code || `http_${resp.status}`, error.message || String(data));
  }
  return data;
}

export async function metricsText() {
  const resp = await fetch(url("/metrics"), { headers: headers() });
  if (!resp.ok) throw new ApiError(resp.status, `http_${resp.status}`, "metrics");
  return resp.text();
}

function basic(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  return "Basic " + btoa(Array.from(bytes, (b) => String.fromCharCode(b)).join(""));
}

// Basic credentials are used once, to create a token; only the token is kept (this tab only).
export async function signIn({ user, password, token }) {
  let auth;
  let id = null;
  if (token) {
    auth = `Bearer ${token.trim()}`;
  } else {
    const made = await api("POST", "/v1/tokens", {
      body: { description: "console" }, // valid for the server's auth.token_ttl
      auth: basic(user, password),
    });
    auth = `Bearer ${made.token}`;
    id = made.id;
  }
  const me = await api("GET", "/v1/me", { auth });
  keep(auth, id);
  session.me = me;
  return me;
}

export async function signOut() {
  if (session.tokenId) {
    try {
      await api("DELETE", `/v1/tokens/${encodeURIComponent(session.tokenId)}`);
    } catch {
      // Gone already, or expired: nothing left to revoke.
    }
  }
  keep(null, null);
  session.me = null;
}

function keep(auth, id) {
  session.auth = auth;
  session.tokenId = id;
  for (const [k, v] of [[KEY, auth], [KEY + ".id", id]]) {
    if (v) sessionStorage.setItem(k, v);
    else sessionStorage.removeItem(k);
  }
}

// --- the caller's rules, as capella/auth/rule.py applies them ------------------------------

const patterns = new Map();

function pattern(glob) {
  let re = patterns.get(glob);
  if (!re) {
    const escaped = glob.split("*").map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    re = new RegExp(`^${escaped.join(".*")}$`, "s");
    patterns.set(glob, re);
  }
  return re;
}

function matches(rule, type, action, name) {
  if (rule.type !== "*" && rule.type !== type) return false;
  const covers =
    rule.effect === "allow"
      ? ["*", "admin", action].includes(rule.action)
      : ["*", action].includes(rule.action);
  return covers && pattern(rule.name).test(name);
}

// Whether the signed-in user may do ``action`` on the ``type`` object ``name``; the server
// decides in the end, this only keeps buttons from offering what would be refused.
export function can(type, action, name) {
  const me = session.me;
  if (!me || me.admin) return true;
  let verdict = false;
  for (const rule of me.rules) {
    if (matches(rule, type, action, name)) {
      if (rule.effect === "deny") return false;
      verdict = true;
    }
  }
  return verdict;
}

// --- the live tail -------------------------------------------------------------------------

// Follow /v1/queues/{queue}/stream from ``after``; reconnects with Last-Event-ID after an
// error. Answers a function that stops it.
export function tail(queue, after, onMessage, onState) {
  const controller = new AbortController();
  let last = after;
  let stopped = false;
  const path = `/v1/queues/${encodeURIComponent(queue)}/stream`;
  (async () => {
    while (!stopped) {
      try {
        const h = headers({ Accept: "text/event-stream" });
        if (last > 0) h["Last-Event-ID"] = String(last);
        const resp = await fetch(url(path), { headers: h, signal: controller.signal });
        if (!resp.ok) {
          const data = await decoded(resp);
          throw new ApiError(resp.status, "stream", (data && data.error && data.error.message) || resp.statusText);
        }
        onState("live");
        const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const event = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            let id = null;
            let data = "";
            for (const line of event.split("\n")) {
              if (line.startsWith("id:")) id = Number(line.slice(3).trim());
              else if (line.startsWith("data:")) data += line.slice(5).trim();
            }
            if (id !== null && data) {
              last = id;
              onMessage(JSON.parse(data));
            }
          }
        }
        if (!stopped) onState("ended; reconnecting");
      } catch (err) {
        if (stopped) return;
        onState(`error: ${err.message}; reconnecting`);
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
  })();
  return () => {
    stopped = true;
    controller.abort();
  };
}
