// Live preview of the next fire times and kind-dependent fields. No framework: the server
// does all time math (same code as the scheduler), this only debounces and renders.
"use strict";
function csSchedulePreview() {
  const panel = document.getElementById("cs-preview");
  if (!panel) return;
  const form = panel.closest("form");
  // Show the runs right under the fields that decide them, not after the policies.
  const when = form.querySelector("fieldset.cs-when");
  if (when) when.after(panel);
  const body = panel.querySelector("tbody");
  const description = document.getElementById("cs-description");
  const errorBox = document.getElementById("cs-preview-error");
  const from = document.getElementById("cs-preview-from");
  const rowOf = (name) => form.querySelector(".field-" + name);
  const value = (name) => {
    const one = form.elements[name];
    if (one && one.value !== undefined) return one.value;
    const date = form.elements[name + "_0"], time = form.elements[name + "_1"];
    return date && date.value ? (date.value + " " + (time && time.value ? time.value : "00:00")) : "";
  };
  const kind = () => (form.querySelector("input[name=kind]:checked") || {}).value || "CRON";

  function showKindFields() {
    const k = kind();
    const show = { cron: k === "CRON", timezone: k === "CRON", interval_seconds: k === "INTERVAL", run_at: k === "ONE_OFF" };
    for (const [name, visible] of Object.entries(show)) {
      const row = rowOf(name);
      if (row) row.hidden = !visible;
    }
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
  }

  function render(data) {
    panel.classList.remove("cs-loading");
    body.replaceChildren();
    errorBox.hidden = data.ok;
    if (!data.ok) {
      description.textContent = "";
      errorBox.textContent = Object.values(data.errors || {}).join(" ") || "Cannot preview.";
      return;
    }
    description.textContent = data.description;
    // The server's error from the last save no longer applies to what is typed now.
    for (const name of ["cron", "timezone"]) {
      const stale = form.querySelector(".field-" + name + " .errorlist");
      if (stale) stale.remove();
    }
    data.rows.forEach((row, i) => {
      const tr = document.createElement("tr");
      if (row.dst) tr.className = "cs-dst";
      cell(tr, String(i + 1));
      cell(tr, row.local_display);
      cell(tr, row.utc_display);
      cell(tr, row.note ? "⚠ " + row.note : "", "cs-note");
      body.appendChild(tr);
    });
    if (!data.rows.length) errorBox.hidden = false, errorBox.textContent = "No future run.";
  }

  let timer = null, seq = 0;
  function refresh() {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const mine = ++seq;
      const params = new URLSearchParams({ kind: kind(), from: from.value });
      for (const name of ["cron", "timezone", "interval_seconds", "run_at", "start_at"]) params.set(name, value(name));
      panel.classList.add("cs-loading");
      try {
        const response = await fetch(panel.dataset.url + "?" + params, { credentials: "same-origin", headers: { Accept: "application/json" } });
        const data = await response.json();
        if (mine === seq) render(data);
      } catch (err) {
        if (mine === seq) render({ ok: false, errors: { network: "Preview unavailable: " + err } });
      }
    }, 250);
  }

  form.addEventListener("input", (e) => { if (e.target.name !== "name") { showKindFields(); refresh(); } });
  form.addEventListener("change", () => { showKindFields(); refresh(); });
  from.addEventListener("input", refresh);
  showKindFields();
  refresh();
}
// Form media loads in <head>, before the form exists.
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", csSchedulePreview);
else csSchedulePreview();
