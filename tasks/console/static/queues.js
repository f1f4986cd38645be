// The queue view (/queues): each platform queue's backlog and its oldest message's age, as
// `python -m tasks status` shows them, from /api/queues.
"use strict";

(function () {
  const { el, td, num, fill, getJson, poll, markNav } = window.rk;
  markNav("/queues");

  const row = (q) => el("tr", { dataset: { queue: q.name, messages: q.messages ?? "" } },
    td(q.name), q.messages === null ? td("-", "num") : num(q.messages),
    td(q.oldest_s === null ? "-" : q.oldest, "num"));

  poll(() => getJson("/api/queues"), (data) => {
    fill(document.querySelector("#queues tbody"), data.map(row));
    const waiting = data.reduce((sum, q) => sum + (q.messages || 0), 0);
    document.getElementById("total").textContent =
      `${waiting.toLocaleString("en")} messages waiting in ${data.length} queues`;
  });
})();
