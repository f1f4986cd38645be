// What every console page shares (base.html loads it before console.js and the pages' own
// scripts): build nodes with textContent only (never
// innerHTML), read the JSON API, POST with the session's CSRF token (X-CSRF-Token header),
// poll a page every `refresh-ms`, redrawing only when its data changed. Times come from the
// server already written in UTC ("2026-12-07 04:47:39 UTC"); the page's own clock is only
// used for "updated", also in UTC.
"use strict";

window.rk = (function () {
  const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
  const csrf = meta("csrf-token");
  const refreshMs = Number(meta("refresh-ms")) || 1500;

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    Object.entries(props || {}).forEach(([key, value]) => {
      if (key === "dataset") Object.assign(node.dataset, value);
      else if (key in node) node[key] = value;
      else node.setAttribute(key, value);
    });
    children.flat().forEach((child) => {
      if (child === null || child === undefined) return;
      node.append(child instanceof Node ? child : String(child));
    });
    return node;
  }

  const td = (value, cls) => el("td", { className: cls || "" }, value);
  const num = (value) => td(Number(value || 0).toLocaleString("en"), "num");
  const fill = (tbody, rows) => tbody.replaceChildren(...rows);
  const badge = (state) =>
    el("span", { className: `state state-${String(state).replace(/\W+/g, "-")}` }, state);

  function bar(share, label) {
    const value = Math.max(0, Math.min(1, share || 0));
    return el("span", { className: "bar" },
      el("progress", { max: 1, value: value, title: label || "" }),
      el("span", { className: "pct" }, `${(value * 100).toFixed(1)}%`));
  }

  function flash(text, kind) {
    const box = document.getElementById("flash");
    box.className = kind || "";
    box.textContent = text;
  }

  async function reply(response) {
    if (response.status === 401) {
      window.location.assign(`/login?next=${encodeURIComponent(window.location.pathname)}`);
      throw new Error("logged out");
    }
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body.data;
  }

  const getJson = async (url) =>
    reply(await fetch(url, { credentials: "same-origin", cache: "no-store" }));

  // `fields`: an object, URLSearchParams, or FormData (a multipart upload).
  async function post(url, fields) {
    const body = fields instanceof FormData || fields instanceof URLSearchParams
      ? fields : new URLSearchParams(fields || {});
    return reply(await fetch(url, { method: "POST", credentials: "same-origin",
      headers: { "X-CSRF-Token": csrf }, body: body }));
  }

  // "2026-12-07 04:47:39 UTC": now, in UTC (never the browser's zone).
  const utcNow = () => `${new Date().toISOString().slice(0, 19).replace("T", " ")} UTC`;

  // The nav link of the section this page belongs to, marked as the current one.
  function markNav(href) {
    document.querySelector(`header nav a[href="${href}"]`)?.setAttribute("aria-current", "page");
  }

  let timer = null;
  let loader = null;
  let drawn = "";

  // Read with `read()`, draw with `draw(data)` when the data changed, again every refreshMs.
  function poll(read, draw) {
    loader = async () => {
      const data = await read();
      const seen = JSON.stringify(data);
      if (seen !== drawn) {
        draw(data);
        drawn = seen;
      }
    };
    refresh();
  }

  async function refresh(redraw) {
    clearTimeout(timer);
    if (!loader) return;
    if (redraw) drawn = "";
    try {
      await loader();
      document.getElementById("updated").textContent = utcNow();
    } catch (error) {
      if (error.message !== "logged out") flash(`cannot refresh: ${error.message}`, "error");
    }
    timer = setTimeout(refresh, refreshMs);
  }

  return { el, td, num, fill, badge, bar, flash, getJson, post, poll, refresh, markNav,
    utcNow };
})();
