// The dead letters (/deadletters): filtered by kind and a search text (ref and reason), the
// count matching, and "replay all matching" / "purge all matching". A bulk action first asks
// the server what the filter matches now (GET /api/deadletters/bulk), has the operator
// confirm that count, then sends it with the highest id shown (`upto`): the server acts on
// exactly those letters, or refuses if they changed meanwhile.
"use strict";

(function () {
  const { el, td, fill, flash, getJson, post, poll, refresh, markNav } = window.rk;
  const kindBox = document.getElementById("letter-kind");
  const searchBox = document.getElementById("letter-search");
  markNav("/deadletters");

  const filter = () => ({ kind: kindBox.value, search: searchBox.value.trim() });
  const query = () => new URLSearchParams(filter()).toString();

  const letterRow = (s) => el("tr", { dataset: { letter: s.id } },
    td(el("a", { href: `/deadletters/${s.id}` }, s.id), "num"), td(s.kind), td(s.ref),
    td(s.created), td(s.replay_task_id || "-"), td(s.reason, "reason"));

  function kinds(counts) {
    const names = Object.keys(counts).sort();
    const chosen = kindBox.value || kindBox.dataset.kind || "";
    if (chosen && !names.includes(chosen)) names.push(chosen);
    const have = Array.from(kindBox.options).map((o) => o.value).join(",");
    if (have === ["", ...names].join(",")) return;
    kindBox.replaceChildren(el("option", { value: "" }, "all kinds"),
      ...names.map((k) => el("option", { value: k, selected: k === chosen }, k)));
  }

  function draw(data) {
    kinds(data.counts);
    const names = Object.keys(data.counts).sort();
    document.getElementById("counts").textContent = names.map(
      (k) => `${k}: ${data.counts[k]}`).join(" · ") || "no dead letters";
    const m = data.matching;
    const matching = document.getElementById("matching");
    matching.dataset.count = m.count;
    matching.textContent = `${m.count.toLocaleString("en")} ${m.count === 1
      ? "letter matches" : "letters match"}` +
      (m.count > data.letters.length ? ` (the newest ${data.letters.length} shown)` : "");
    fill(document.querySelector("#letters tbody"), data.letters.length
      ? data.letters.map(letterRow)
      : [el("tr", {}, el("td", { colSpan: 6 }, "no letter matches"))]);
  }

  // The address says what is shown: a reload or a shared link shows the same letters.
  function filterChanged() {
    window.history.replaceState(null, "", `/deadletters?${query()}`);
    refresh(true);
  }

  function question(action, p) {
    const verb = action === "replay" ? "Replay" : "Purge (delete for good)";
    const again = action === "replay" && p.count > p.unreplayed
      ? ` ${p.count - p.unreplayed} of them were replayed already and will be skipped.` : "";
    return `${verb} ${p.count} ${p.described}?${again}`;
  }

  function inWords(action, r) {
    const done = action === "replay" ? "replayed" : "purged";
    const parts = [`${done} ${r.done} of ${r.matched} ${r.described}`];
    if (r.already_replayed) parts.push(`${r.already_replayed} already replayed`);
    if (r.not_replayable) parts.push(`${r.not_replayable} not replayable`);
    if (r.gone) parts.push(`${r.gone} gone meanwhile`);
    if (r.stopped) parts.push(`stopped at ${r.stopped}`);
    return parts.join(", ");
  }

  async function bulk(action) {
    try {
      const p = await getJson(`/api/deadletters/bulk?${query()}`);
      if (!p.count) {
        flash(`no ${p.described} to ${action}`, "error");
        return;
      }
      if (!window.confirm(question(action, p))) {
        flash(`nothing was ${action === "replay" ? "replayed" : "purged"}`, "");
        return;
      }
      const done = await post("/api/deadletters/bulk", { action: action, kind: p.kind || "",
        search: p.search, upto: p.upto, expected: p.count });
      flash(`done: ${inWords(action, done)}`, done.stopped ? "error" : "ok");
    } catch (error) {
      flash(`refused: ${error.message}`, "error");
    }
    refresh(true);
  }

  let typing = null;
  searchBox.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(filterChanged, 300);
  });
  document.getElementById("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    filterChanged();
  });
  kindBox.addEventListener("change", filterChanged);
  document.getElementById("btn-bulk-replay").addEventListener("click", () => bulk("replay"));
  document.getElementById("btn-bulk-purge").addEventListener("click", () => bulk("purge"));

  poll(() => getJson(`/api/deadletters/search?${query()}`), draw);
})();
