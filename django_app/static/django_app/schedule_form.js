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
    const show = { cron: k === "CRON", timezone: k === "CRON", dst_gap: k === "CRON", dst_fold: k === "CRON", interval_seconds: k === "INTERVAL", run_at: k === "ONE_OFF" };
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

  // Errors go on the field they are about, as the server's do after a save; the panel only
  // carries what belongs to no field (a network failure, "no future run").
  const FIELDS = ["cron", "timezone", "dst_gap", "dst_fold", "interval_seconds", "run_at", "start_at", "kind"];
  function clearLiveErrors() {
    form.querySelectorAll(".cs-live-error").forEach((el) => el.remove());
  }
  function showFieldError(name, message) {
    const row = rowOf(name);
    if (!row || row.hidden) return false;
    const stale = row.querySelector(".errorlist");
    if (stale) stale.remove();  // the last save's error no longer applies to what is typed now
    const list = document.createElement("ul");
    list.className = "errorlist cs-live-error";
    list.setAttribute("role", "alert");
    const item = document.createElement("li");
    item.textContent = message;
    list.appendChild(item);
    const input = row.querySelector("input, select, textarea");
    (input && input.parentElement ? input : row.firstElementChild || row).after(list);
    return true;
  }

  function render(data) {
    panel.classList.remove("cs-loading");
    body.replaceChildren();
    clearLiveErrors();
    errorBox.hidden = true;
    if (!data.ok) {
      description.textContent = "";
      const loose = [];
      for (const [name, message] of Object.entries(data.errors || {})) {
        if (!(FIELDS.includes(name) && showFieldError(name, message))) loose.push(message);
      }
      if (loose.length) errorBox.hidden = false, errorBox.textContent = loose.join(" ");
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

  // A pristine form has nothing to preview yet: say so instead of asking the server (which
  // would answer 400 and log a bad request for every page load).
  const decidingField = { CRON: "cron", INTERVAL: "interval_seconds", ONE_OFF: "run_at" };
  function nothingTyped() {
    return !value(decidingField[kind()] || "cron").trim();
  }

  let timer = null, seq = 0;
  function refresh() {
    clearTimeout(timer);
    if (nothingTyped()) {
      ++seq;
      clearLiveErrors();
      body.replaceChildren();
      errorBox.hidden = true;
      description.textContent = panel.dataset.hint || "";
      return;
    }
    timer = setTimeout(async () => {
      const mine = ++seq;
      const params = new URLSearchParams({ kind: kind(), from: from.value });
      for (const name of ["cron", "timezone", "dst_gap", "dst_fold", "interval_seconds", "run_at", "start_at"]) params.set(name, value(name));
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
