// A CSV job's start with an uploaded input (/jobs/J/upload): the file and the run's
// parameters go as one multipart POST with the session's CSRF token; the server checks the
// whole file first (a bad record is refused naming its line, nothing is written).
"use strict";

(function () {
  const { el, flash, post, markNav } = window.rk;
  const form = document.getElementById("upload-form");
  const job = form.dataset.job;
  const maxBytes = Number(form.dataset.maxBytes);
  markNav("/jobs");
  document.getElementById("updated").textContent = window.rk.utcNow();

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const file = document.getElementById("csv-file").files[0];
    if (!file) {
      flash("choose a CSV file first", "error");
      return;
    }
    if (file.size > maxBytes) {
      flash(`refused: the file is ${file.size.toLocaleString("en")} bytes; at most ` +
        `${maxBytes.toLocaleString("en")} are taken`, "error");
      return;
    }
    const fields = new FormData();
    fields.append("csv", file, file.name);
    form.querySelectorAll("input.param").forEach((input) => {
      if (input.value.trim() !== "") fields.append("param", `${input.name}=${input.value}`);
    });
    const button = document.getElementById("btn-upload");
    button.disabled = true;
    try {
      const done = await post(`/api/jobs/${encodeURIComponent(job)}/upload`, fields);
      flash(`done: run ${done.run} started with ${done.input_lines} lines`, "ok");
      const link = document.getElementById("run-link");
      link.replaceChildren(el("a", { id: "started-run",
        href: `/jobs/${encodeURIComponent(job)}/runs/${done.run}` }, `run ${done.run} →`));
    } catch (error) {
      flash(`refused: ${error.message}`, "error");
    } finally {
      button.disabled = false;
    }
  });
})();
