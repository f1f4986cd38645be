// The rangekeeper console: fills each page from the JSON API and refreshes it every
// `refresh-ms` without a reload. Every text goes in through textContent (never innerHTML),
// and every POST carries the session's CSRF token in the X-CSRF-Token header.
"use strict";

(function () {
  const refreshMs = Number(document.querySelector('meta[name="refresh-ms"]').content) || 1500;
  const page = document.body.dataset.page;

  // The helpers every page shares (static/pagekit.js, loaded first): nodes by textContent,
  // the JSON API, POSTs with the session's CSRF token.
  const { el, td, num, fill, bar, badge, flash, getJson, post } = window.rk;

  // A time as tasks/config/clock.py's `shown` writes it, in UTC with the zone named
  // ("2026-12-07 04:47:39 UTC"), from the API's ISO 8601 (or a Date); "-" for none.
  function shown(when) {
    if (when === null || when === undefined || when === "") return "-";
    const date = when instanceof Date ? when : new Date(when);
    if (Number.isNaN(date.getTime())) return String(when);
    return `${date.toISOString().slice(0, 19).replace("T", " ")} UTC`;
  }

  // -- pages -------------------------------------------------------------------------------

  function jobRow(j) {
    const link = el("a", { href: `/jobs/${encodeURIComponent(j.job)}` }, j.job);
    const label = `ids walked ${j.ids_walked} of ${j.ids_planned}`;
    const parts = Object.entries(j.partitions).map(([s, n]) => `${n} ${s}`).join(", ");
    return el("tr", { dataset: { job: j.job, share: j.share } },
      td(link), td(badge(j.run ? `${j.state}` : j.state)), td(bar(j.share, label), "progress"),
      num(j.rows_done), num(j.rows_per_s), td(j.eta, "num"),
      td(j.throttle_rows_per_s ? `${j.throttle_rows_per_s} rows/s` : "-", "num wide"),
      td(parts || "-", "wide"));
  }

  async function jobs() {
    const data = await getJson("/api/jobs");
    const tbody = document.querySelector("#jobs tbody");
    fill(tbody, data.length ? data.map(jobRow)
      : [el("tr", {}, el("td", { colSpan: 8 }, "no range job is registered"))]);
  }

  function summary(j) {
    if (!j) return [el("p", {}, "unknown job")];
    return [
      el("p", {}, badge(j.state), j.run ? ` run ${j.run}` : "",
        j.throttle_rows_per_s ? ` · throttle ${j.throttle_rows_per_s} rows/s` : ""),
      el("div", { className: "big", dataset: { share: j.share } },
        bar(j.share, `ids walked ${j.ids_walked} of ${j.ids_planned}`)),
      el("p", { className: "facts" },
        `${Number(j.rows_done).toLocaleString("en")} rows done · `,
        j.rows_skipped ? `${Number(j.rows_skipped).toLocaleString("en")} skipped · ` : "",
        `${Number(j.rows_per_s).toLocaleString("en")} rows/s · ETA ${j.eta}`),
    ];
  }

  // Seconds as the CLI prints them: 1h02m, 3m05s, 45s.
  function duration(seconds) {
    const whole = Math.round(seconds || 0);
    const h = Math.floor(whole / 3600), m = Math.floor((whole % 3600) / 60), s = whole % 60;
    const two = (n) => String(n).padStart(2, "0");
    return h ? `${h}h${two(m)}m` : m ? `${m}m${two(s)}s` : `${s}s`;
  }

  function partRow(p) {
    const state = p.error ? `${p.status}: ${p.error}` : p.status;
    return el("tr", { dataset: { part: p.part, state: p.status } },
      td(p.part, "num"), td(badge(state)), td(bar(p.share, `${p.lo}..${p.hi}`), "progress"),
      td(p.owner || "-", "owner"), num(p.checkpoint), num(p.rows_done), num(p.rows_per_s),
      td(p.fence, "num wide"), td(p.takeovers, "num wide"));
  }

  // An event's detail on one line; a failed partition's traceback opens below it.
  function eventItem(e) {
    const [first, ...rest] = String(e.detail || "").split("\n");
    const line = `${shown(e.at)} ${e.verb} by ${e.actor}${first ? ` (${first})` : ""}`;
    if (!rest.length) return el("li", {}, line);
    return el("li", {}, el("details", { className: "traceback" },
      el("summary", {}, line), el("pre", {}, rest.join("\n"))));
  }

  function runRow(r) {
    const events = el("ul", { className: "events" }, r.events.map(eventItem));
    const params = r.params ? Object.entries(r.params).map(([k, v]) => `${k}=${v}`).join(" ")
      : "-";
    return el("tr", { dataset: { run: r.run, state: r.state } },
      td(r.run, "num"), td(badge(r.state)), td(shown(r.started_at)), td(shown(r.finished_at)),
      td(duration(r.duration_s), "num"), td(r.started_by || "-"), num(r.rows), num(r.skipped),
      td(r.rows_per_s ? `${r.rows_per_s} rows/s` : "-", "num"), td(params), td(events));
  }

  // The job page's filter and page, from its own address: the API takes the same names.
  const PAGE_PARAMS = ["state", "owner", "slowest", "limit", "after"];

  function pageParams(after) {
    const here = new URLSearchParams(window.location.search);
    const out = new URLSearchParams();
    PAGE_PARAMS.forEach((key) => here.getAll(key).filter((v) => v !== "")
      .forEach((v) => out.append(key, v)));
    if (after !== undefined) {
      out.delete("after");
      if (after !== "") out.set("after", after);
    }
    return out;
  }

  // One segment per partition state (its width the state's count), never one per partition.
  function stateBar(j) {
    const states = Object.entries((j && j.states) || {});
    const name = encodeURIComponent(j ? j.job : "");
    return states.map(([state, t]) => {
      const seg = el("a", { className: `seg state-${state}`, href: `/jobs/${name}?state=${state}`,
        title: `${t.partitions} ${state}`, dataset: { state: state, count: t.partitions } });
      seg.style.flexGrow = String(t.partitions);
      return seg;
    });
  }

  function stateTotals(j) {
    return Object.entries((j && j.states) || {}).map(([state, t]) =>
      `${Number(t.partitions).toLocaleString("en")} ${state}` +
      ` (${Number(t.rows_done).toLocaleString("en")} rows` +
      `${t.rows_per_s ? `, ${Math.round(t.rows_per_s).toLocaleString("en")} rows/s` : ""})`)
      .join(" · ") || "no partitions";
  }

  function pager(page) {
    document.getElementById("page-info").textContent =
      `${page.shown.toLocaleString("en")} of ${page.total.toLocaleString("en")} partitions` +
      (page.slowest ? ", slowest first" : "");
    [["prev", page.prev], ["next", page.next]].forEach(([id, cursor]) => {
      const link = document.getElementById(id);
      link.hidden = cursor === null;
      if (cursor !== null) link.href = `?${pageParams(cursor)}`;
    });
  }

  async function job() {
    const name = document.getElementById("job").dataset.job;
    const data = await getJson(`/api/jobs/${encodeURIComponent(name)}?${pageParams()}`);
    document.getElementById("summary").replaceChildren(...summary(data.job));
    document.getElementById("states").replaceChildren(...stateBar(data.job));
    document.getElementById("state-totals").textContent = stateTotals(data.job);
    fill(document.querySelector("#partitions tbody"), data.partitions.map(partRow));
    pager(data.page);
    fill(document.querySelector("#runs tbody"), data.runs.map(runRow));
    paramInputs(data.param_fields || []);
    const sched = data.schedule;
    document.getElementById("schedule-now").textContent = sched && sched.cron
      ? `now: ${sched.cron} (${sched.policy}, missed ${sched.missed}), next ${shown(sched.next_due)}`
      : "no schedule";
    showAllowed(data.allowed);
  }

  // Exactly the controls the job API says the run's state allows this user (none for a
  // viewer): the rule is the server's (tasks/console/roles.py), the page only follows it.
  function showAllowed(allowed) {
    const ok = new Set(allowed || []);
    document.querySelectorAll(".allowed-by-state").forEach((node) => {
      node.hidden = !ok.has(node.dataset.verb);
    });
    document.getElementById("controls")?.setAttribute("data-allowed", [...ok].join(" "));
  }

  // The start form: one input per declared run parameter (made once), sent as param=NAME=VALUE.
  function paramInputs(fields) {
    const holder = document.getElementById("param-fields");
    if (!holder || holder.dataset.made) return;
    holder.dataset.made = "1";
    holder.replaceChildren(...fields.map((f) => el("label", {}, `${f.name} `, el("input", {
      type: "text", name: f.name, className: "param", id: `param-${f.name}`,
      placeholder: f.type + (f.required ? " (required)" : ""), required: f.required }))));
  }

  function startFields() {
    const fields = new URLSearchParams();
    document.querySelectorAll("#param-fields input.param").forEach((input) => {
      if (input.value.trim() !== "") fields.append("param", `${input.name}=${input.value}`);
    });
    return fields;
  }

  function nodeRows(n) {
    if (n.error) {
      return [el("tr", { dataset: { node: n.node } }, td(n.node, "num"), td("-", "num"),
        td(`unreachable: ${n.error}`), td("-"), td("-"), td("-"), td("-"), num(n.dead_letters))];
    }
    return Object.keys(n.queued).map((queue, i) => el("tr", { dataset: { node: n.node } },
      td(i ? "" : n.node, "num"), td(i ? "" : n.term, "num"), td(i ? "" : n.window),
      td(queue), num(n.queued[queue]), num(n.due[queue]), num(n.backlog[queue]),
      td(i ? "" : n.dead_letters, "num")));
  }

  async function restock() {
    const data = await getJson("/api/restock");
    fill(document.querySelector("#nodes tbody"), data.flatMap(nodeRows));
  }

  async function letter() {
    const id = document.getElementById("letter").dataset.letter;
    const data = await getJson(`/api/deadletters/${id}`);
    const facts = ["kind", "ref", "reason", "created_at", "replayed_at", "replay_task_id",
      "replayable", "refusal"];
    const times = ["created_at", "replayed_at"];
    document.getElementById("facts").replaceChildren(...facts.flatMap((key) =>
      [el("dt", {}, key), el("dd", { id: `fact-${key}` },
        times.includes(key) ? shown(data[key]) : String(data[key] ?? "-"))]));
    document.getElementById("payload").textContent = data.payload;
    document.getElementById("btn-replay").disabled = !data.replayable;
  }

  // -- buttons -----------------------------------------------------------------------------

  // A control's reply in words: "job cm_data, state paused, parked 3" (lists by their length).
  function inWords(result) {
    if (result === null || typeof result !== "object") return String(result);
    return Object.entries(result)
      .filter(([, value]) => value !== null && value !== undefined)
      .map(([key, value]) => `${key.replaceAll("_", " ")} ${
        Array.isArray(value) ? value.length
          : typeof value === "object" ? JSON.stringify(value) : value}`)
      .join(", ");
  }

  async function act(url, fields, confirmText, done) {
    if (confirmText && !window.confirm(confirmText)) return;
    try {
      const result = await post(url, fields);
      flash(`done: ${inWords(result)}`, "ok");
      if (done) done(result);
    } catch (error) {
      flash(`refused: ${error.message}`, "error");
    }
    refresh();
  }

  function wire() {
    const jobName = document.getElementById("job")?.dataset.job;
    document.querySelectorAll("button.control").forEach((button) => {
      button.addEventListener("click", () => act(
        `/api/jobs/${encodeURIComponent(jobName)}/${button.dataset.verb}`, {},
        button.dataset.confirm));
    });
    document.getElementById("start-form")?.addEventListener("submit", (event) => {
      event.preventDefault();
      act(`/api/jobs/${encodeURIComponent(jobName)}/start`, startFields());
    });
    document.getElementById("schedule-form")?.addEventListener("submit", (event) => {
      event.preventDefault();
      act(`/api/jobs/${encodeURIComponent(jobName)}/schedule`, {
        cron: document.getElementById("cron").value,
        policy: document.getElementById("policy").value,
        missed: document.getElementById("missed").value });
    });
    document.getElementById("btn-unschedule")?.addEventListener("click", () => act(
      `/api/jobs/${encodeURIComponent(jobName)}/schedule`, { clear: "1" }));
    document.getElementById("btn-dry-run")?.addEventListener("click", async () => {
      const shown = document.getElementById("dry-run");
      try {
        const plan = await post(`/api/jobs/${encodeURIComponent(jobName)}/dry-run`,
          startFields());
        shown.textContent = JSON.stringify(plan, null, 2);
        shown.hidden = false;
        flash("dry run: nothing was written", "ok");
      } catch (error) {
        flash(`refused: ${error.message}`, "error");
      }
    });
    document.getElementById("throttle-form")?.addEventListener("submit", (event) => {
      event.preventDefault();
      act(`/api/jobs/${encodeURIComponent(jobName)}/throttle`,
        { rows_per_s: document.getElementById("rows-per-s").value });
    });
    const letterId = document.getElementById("letter")?.dataset.letter;
    document.querySelectorAll("button.letter-action").forEach((button) => {
      button.addEventListener("click", () => act(
        `/api/deadletters/${letterId}/${button.dataset.action}`, {}, button.dataset.confirm,
        () => { if (button.dataset.action === "purge") window.location.assign("/deadletters"); }));
    });
    document.getElementById("kind")?.addEventListener("change", () => refresh());
    const older = document.getElementById("purge-older-form");
    older?.addEventListener("submit", (event) => {
      event.preventDefault();
      act("/api/deadletters/purge", { older_than: document.getElementById("older-than").value },
        older.dataset.confirm);
    });
  }

  const pages = { jobs, job, restock, letter };
  let timer = null;

  async function refresh() {
    clearTimeout(timer);
    const load = pages[page];
    if (!load) return;
    try {
      await load();
      document.getElementById("updated").textContent = shown(new Date());
    } catch (error) {
      if (error.message !== "logged out") flash(`cannot refresh: ${error.message}`, "error");
    }
    timer = setTimeout(refresh, refreshMs);
  }

  wire();
  refresh();
})();
