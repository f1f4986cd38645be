// The run page (/jobs/J/runs/N) and a job's run list (/jobs/J/runs), from /api/jobs/J/runs.
"use strict";

(function () {
  const { el, td, num, fill, badge, bar, getJson, poll, markNav } = window.rk;
  const page = document.body.dataset.page;
  const root = document.getElementById("job");
  const job = root.dataset.job;
  const base = `/api/jobs/${encodeURIComponent(job)}/runs`;
  markNav("/jobs");

  const params = (p) => (p && Object.keys(p).length
    ? Object.entries(p).map(([k, v]) => `${k}=${v}`).join(" ") : "-");

  function facts(r) {
    const shown = [
      ["state", badge(r.state)], ["started", r.started], ["finished", r.finished],
      ["duration", r.duration], ["started by", r.started_by || "-"],
      ["parameters", params(r.params)],
      ["rows done", Number(r.rows).toLocaleString("en")],
      ["rows skipped", Number(r.skipped).toLocaleString("en")],
      ["throttle", r.rows_per_s ? `${r.rows_per_s} rows/s` : "-"]];
    return shown.flatMap(([key, value]) => [el("dt", {}, key),
      el("dd", { id: `fact-${key.replace(/\W+/g, "-")}` }, value)]);
  }

  function progress(p) {
    if (!p) return [el("p", { className: "facts" }, "this run is not live: no progress to show")];
    return [el("div", { className: "big", dataset: { share: p.share } },
      bar(p.share, `ids walked ${p.ids_walked} of ${p.ids_planned}`)),
    el("p", { className: "facts" },
      `${Number(p.rows_per_s).toLocaleString("en")} rows/s · ETA ${p.eta}`)];
  }

  const eventRow = (e) => el("tr", { dataset: { verb: e.verb } },
    td(e.shown), td(e.verb), td(e.actor, "owner"),
    td(String(e.detail || "").split("\n")[0] || "-", "reason"));

  function failure(f) {
    return el("article", { className: "failure", dataset: { part: f.part } },
      el("h3", {}, `part ${f.part ?? "?"} failed at ${f.shown} on ${f.by}: ${f.error}`),
      el("pre", { className: "traceback" }, f.traceback || "(no traceback kept)"));
  }

  const skippedRow = (s) => el("tr", { dataset: { letter: s.letter } },
    td(el("a", { href: `/deadletters/${s.letter}` }, s.letter), "num"), td(s.row_id, "num"),
    td(s.reason || "-", "reason"));

  function drawRun(r) {
    document.getElementById("facts").replaceChildren(...facts(r));
    document.getElementById("progress").replaceChildren(...progress(r.progress));
    fill(document.querySelector("#events tbody"), r.events.map(eventRow));
    document.getElementById("failures").replaceChildren(...(r.failures.length
      ? r.failures.map(failure) : [el("p", { className: "facts" }, "no partition failed")]));
    fill(document.querySelector("#skipped tbody"), r.skipped_rows.length
      ? r.skipped_rows.map(skippedRow)
      : [el("tr", {}, el("td", { colSpan: 3 }, "no skipped row waits for a retry"))]);
  }

  const runRow = (r) => el("tr", { dataset: { run: r.run, state: r.state } },
    td(el("a", { href: `/jobs/${encodeURIComponent(job)}/runs/${r.run}` }, `run ${r.run}`)),
    td(badge(r.state)), td(r.started), td(r.finished), td(r.duration, "num"),
    td(r.started_by || "-", "owner"), num(r.rows), num(r.skipped), td(params(r.params)));

  function drawRuns(data) {
    fill(document.querySelector("#runs tbody"), data.runs.length ? data.runs.map(runRow)
      : [el("tr", {}, el("td", { colSpan: 9 }, "no runs yet"))]);
  }

  if (page === "run") poll(() => getJson(`${base}/${root.dataset.run}`), drawRun);
  else poll(() => getJson(base), drawRuns);
})();
