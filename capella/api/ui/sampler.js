// Samples the API every few seconds while the tab is visible and keeps a short history in
// memory: sizes, rates (from the /metrics counters when the user may read them, else from the
// queues' last ids), subscription lag and copy-handler lag. The charts draw these series.

import { api, metricsText } from "./api.js";

const KEEP = 3600; // seconds of history per series: the longest chart window
const KEEP_POINTS = 4000; // and at most this many samples (fast sampling with ?sample=)
const series = new Map(); // key -> [{t, v}]
const counters = new Map(); // key -> {t, c}: the last counter reading, for rates
const listeners = new Set();

export const latest = { queues: [], handlers: [], metrics: false, at: 0, error: null };

export const interval = Math.max(0.2, Number(new URLSearchParams(location.search).get("sample")) || 5);

// The time windows a chart can show; the choice is kept in this browser.
export const WINDOWS = [
  [60, "1 min"],
  [300, "5 min"],
  [900, "15 min"],
  [3600, "1 h"],
];
const WINDOW_KEY = "capella.window";
let span = WINDOWS.some(([s]) => s === Number(localStorage.getItem(WINDOW_KEY))) ? Number(localStorage.getItem(WINDOW_KEY)) : 300;

export function chartWindow() {
  return { seconds: span, label: WINDOWS.find(([s]) => s === span)[1] };
}

export function setWindow(seconds) {
  span = Number(seconds);
  localStorage.setItem(WINDOW_KEY, String(span));
}

export function record(key, value, t = Date.now() / 1000) {
  let points = series.get(key);
  if (!points) series.set(key, (points = []));
  points.push({ t, v: value });
  let old = 0;
  while (old < points.length && points[old].t < t - KEEP) old += 1;
  old = Math.max(old, points.length - KEEP_POINTS);
  if (old > 0) points.splice(0, old);
}

// The samples of the chosen window, oldest first.
export function points(key, now = Date.now() / 1000) {
  return (series.get(key) || []).filter((p) => p.t >= now - span);
}

export function last(key) {
  const points = series.get(key);
  return points && points.length ? points[points.length - 1].v : null;
}

// Per-second rate of a counter since its previous reading (null on the first one).
function rateOf(key, count, t) {
  const prev = counters.get(key);
  counters.set(key, { t, c: count });
  if (!prev || t <= prev.t) return null;
  return Math.max(0, (count - prev.c) / (t - prev.t));
}

export function onSample(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

// Prometheus text: {metric: {queue: value}} for the per-queue counters the console charts.
function parseMetrics(text) {
  const found = {};
  const re = /^(capella_[a-z_]+)\{queue="([^"]*)"\} ([0-9.e+-]+)$/gm;
  for (const [, name, queue, value] of text.matchAll(re)) {
    (found[name] ||= {})[queue] = Number(value);
  }
  return found;
}

let metricsAllowed = true;

export async function sample() {
  const t = Date.now() / 1000;
  const [queues, handlers, metrics] = await Promise.allSettled([
    api("GET", "/v1/queues"),
    api("GET", "/v1/handlers"),
    metricsAllowed ? metricsText() : Promise.reject(new Error("not allowed")),
  ]);
  if (metrics.status === "rejected" && metrics.reason.status === 403) metricsAllowed = false;
  const counts = metrics.status === "fulfilled" ? parseMetrics(metrics.value) : null;
  latest.metrics = counts !== null;
  latest.error = queues.status === "rejected" ? queues.reason.message : null;
  if (queues.status === "fulfilled") {
    latest.queues = queues.value.queues;
    for (const q of latest.queues) {
      const s = q.stats;
      record(`messages:${q.name}`, s.messages, t);
      record(`bytes:${q.name}`, s.bytes, t);
      const produced = counts ? counts.capella_produced_messages_total?.[q.name] : s.last_id;
      record(`produce:${q.name}`, produced === undefined ? null : rateOf(`produced:${q.name}`, produced, t), t);
      const read = counts ? counts.capella_read_messages_total?.[q.name] : undefined;
      record(`consume:${q.name}`, read === undefined ? null : rateOf(`read:${q.name}`, read, t), t);
    }
  }
  if (handlers.status === "fulfilled") {
    latest.handlers = handlers.value.handlers;
    for (const hd of latest.handlers) {
      if (hd.type === "copy" && hd.status.lag !== undefined) record(`copylag:${hd.name}`, hd.status.lag, t);
    }
  }
  latest.at = t;
  for (const fn of listeners) fn();
}

let timer = null;

export function start() {
  if (timer !== null) return;
  const tick = () => {
    if (!document.hidden) sample().catch(() => {});
  };
  tick();
  timer = setInterval(tick, interval * 1000);
}

export function stop() {
  clearInterval(timer);
  timer = null;
}
