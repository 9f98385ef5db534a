// The console: sign-in, the page for the address's #hash, and the sampling loop.

import { api, session, signIn, signOut } from "./api.js";
import { button, h } from "./dom.js";
import * as sampler from "./sampler.js";
import { overview } from "./page-overview.js";
import { queuePage } from "./page-queue.js";
import { handlersPage } from "./page-handlers.js";
import { replicationPage } from "./page-replication.js";
import { workPage } from "./page-work.js";
import { scheduledPage } from "./page-scheduled.js";

const PAGES = {
  "": overview,
  queue: queuePage,
  handlers: handlersPage,
  replication: replicationPage,
  work: workPage,
  scheduled: scheduledPage,
};

const main = document.getElementById("main");
let current = null; // {refresh?, stop?} of the page shown
let unsubscribe = null;

let shown = 0; // counts page changes, so a page that finishes loading late is dropped

async function show() {
  const generation = ++shown;
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  const [name = "", ...args] = parts;
  current?.stop?.();
  unsubscribe?.();
  current = null;
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.page === (name === "queue" ? "" : name));
  }
  const page = PAGES[name];
  const root = h("div", { class: "page", "data-page": name || "overview" });
  main.replaceChildren(root);
  document.getElementById("status").textContent = "";
  if (!page) {
    root.append(h("p", { class: "error" }, `No page ${name}.`));
    return;
  }
  let loaded;
  try {
    loaded = (await page(root, args)) || {};
  } catch (err) {
    root.append(h("p", { class: "error", "data-testid": "page-error" }, err.message));
    return;
  }
  if (generation !== shown) {
    loaded.stop?.(); // the user went elsewhere while it loaded
    return;
  }
  current = loaded;
  if (current.refresh) unsubscribe = sampler.onSample(() => refresh(current));
}

// A page refreshes with each sample; a failed refresh keeps what is shown and says why.
async function refresh(page) {
  const status = document.getElementById("status");
  try {
    await page.refresh();
    status.textContent = "";
  } catch (err) {
    if (page === current) status.textContent = `Could not refresh: ${err.message}`;
  }
}

// The charts' time window, chosen in the header; the page redraws at once.
function pickWindow() {
  const select = document.getElementById("window");
  select.replaceChildren(...sampler.WINDOWS.map(([seconds, label]) => h("option", { value: seconds }, label)));
  select.value = String(sampler.chartWindow().seconds);
  select.addEventListener("change", () => {
    sampler.setWindow(select.value);
    if (current?.refresh) refresh(current);
  });
}

function showWho() {
  const who = document.getElementById("who");
  const me = session.me;
  if (!me || me.user === null) {
    who.replaceChildren(h("span", { class: "muted", "data-testid": "who" }, "authentication off"));
    return;
  }
  who.replaceChildren(
    h("span", { "data-testid": "who" }, me.user, me.admin ? " (admin)" : ""),
    " ",
    button("Sign out", async () => {
      await signOut();
      location.reload();
    }, { testid: "signout" }),
  );
}

function askSignIn() {
  const dialog = document.getElementById("signin");
  const form = document.getElementById("signin-form");
  const error = document.getElementById("signin-error");
  return new Promise((resolve) => {
    form.onsubmit = async (event) => {
      event.preventDefault();
      const data = new FormData(form);
      error.textContent = "";
      try {
        const me = await signIn({
          user: data.get("user"),
          password: data.get("password"),
          token: data.get("token"),
        });
        form.reset();
        dialog.close();
        resolve(me);
      } catch (err) {
        error.textContent = err.status === 401 ? "Wrong user, password or token." : err.message;
      }
    };
    if (!dialog.open) dialog.showModal();
  });
}

async function identify() {
  try {
    return await api("GET", "/v1/me");
  } catch (err) {
    if (err.status !== 401) throw err;
    return askSignIn();
  }
}

async function boot() {
  session.me = await identify();
  // From now on a 401 means the token expired or was revoked: ask again, then carry on
  // where the user was.
  session.onUnauthorized = async () => {
    if (document.getElementById("signin").open) return;
    session.me = await askSignIn();
    showWho();
    show();
  };
  showWho();
  pickWindow();
  window.addEventListener("hashchange", show);
  await show();
  sampler.start();
}

boot().catch((err) => main.replaceChildren(h("p", { class: "error" }, `Cannot reach the broker: ${err.message}`)));
