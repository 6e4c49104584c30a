// The combo editor's targets table: drag (or Alt+arrow) to reorder, which rewrites the hidden
// position fields, and a model picker filled with the chosen provider's declared models
// ("Other model…" keeps any id possible). Without JavaScript the plain fields still work.
(function () {
  "use strict";
  var OTHER = "__other__";

  function group() { return document.getElementById("targets-group"); }

  function formRows(tbody) {
    return Array.prototype.filter.call(tbody.querySelectorAll("tr.form-row"), function (tr) {
      return !tr.classList.contains("empty-form");
    });
  }

  function renumber() {
    var g = group();
    if (!g) { return; }
    formRows(g.querySelector("tbody")).forEach(function (tr, i) {
      var input = tr.querySelector("input.ocx-position");
      if (input) { input.value = String(i); }
    });
  }

  // -- reordering ------------------------------------------------------------------------
  function addHandle(tr) {
    var cell = tr.querySelector("td.original");
    if (!cell || cell.querySelector(".ocx-drag")) { return; }
    var handle = document.createElement("button");
    handle.type = "button";
    handle.className = "ocx-drag";
    handle.title = "Drag to reorder (or focus and press Alt+Up / Alt+Down)";
    handle.setAttribute("aria-label", "Move target");
    handle.textContent = "\u2630";
    cell.insertBefore(handle, cell.firstChild);
  }

  function move(tr, before) {
    // `before`: the row to insert in front of, or null for the end (ahead of the template).
    var tbody = tr.parentNode;
    var errors = tr.previousElementSibling;
    var anchor = before || tbody.querySelector("tr.empty-form") || null;
    if (errors && errors.classList.contains("row-form-errors")) { tbody.insertBefore(errors, anchor); }
    tbody.insertBefore(tr, anchor);
    var add = tbody.querySelector("tr.add-row");
    if (add) { tbody.appendChild(add); }
    renumber();
  }

  function startDrag(event, tr) {
    var tbody = tr.parentNode;
    tr.classList.add("ocx-dragging");
    event.preventDefault();
    function onMove(e) {
      var rows = formRows(tbody).filter(function (r) { return r !== tr; });
      var target = null;
      for (var i = 0; i < rows.length; i++) {
        var box = rows[i].getBoundingClientRect();
        if (e.clientY < box.top + box.height / 2) { target = rows[i]; break; }
      }
      if (target !== tr.nextElementSibling || target === null) { move(tr, target); }
    }
    function onUp() {
      tr.classList.remove("ocx-dragging");
      document.removeEventListener("pointermove", onMove);
      document.removeEventListener("pointerup", onUp);
      renumber();
    }
    document.addEventListener("pointermove", onMove);
    document.addEventListener("pointerup", onUp);
  }

  // -- model picker ----------------------------------------------------------------------
  var declared = {};

  function modelInput(tr) { return tr.querySelector('input[name$="-model"]'); }
  function providerSelect(tr) { return tr.querySelector('select[name$="-provider"]'); }

  function option(select, value, text) {
    var o = document.createElement("option");
    o.value = value;
    o.textContent = text;
    select.appendChild(o);
  }

  function syncPicker(tr, providerChanged) {
    var input = modelInput(tr);
    var provider = providerSelect(tr);
    if (!input || !provider) { return; }
    var picker = tr.querySelector("select.ocx-model-select");
    if (!picker) {
      picker = document.createElement("select");
      picker.className = "ocx-model-select";
      picker.setAttribute("aria-label", "Model");
      input.parentNode.insertBefore(picker, input);
    }
    var models = declared[provider.value] || [];
    var wasOther = picker.value === OTHER;
    picker.innerHTML = "";
    if (!models.length) {
      // Nothing declared (or no provider yet): a free-text model id.
      picker.style.display = "none";
      input.style.display = "";
      input.placeholder = provider.value ? "model id (none declared)" : "";
      return;
    }
    picker.style.display = "";
    option(picker, "", "Choose a model\u2026");
    models.forEach(function (m) { option(picker, m, m); });
    option(picker, OTHER, "Other model (not declared)\u2026");
    // A model picked for the previous provider does not carry over; a typed one does.
    if (providerChanged && !wasOther && input.dataset.picked === "1" &&
        models.indexOf(input.value) < 0) { input.value = ""; }
    if (models.indexOf(input.value) >= 0) {
      input.dataset.picked = "1";
      picker.value = input.value;
      input.style.display = "none";
    } else if (input.value || wasOther) {
      picker.value = OTHER;
      input.style.display = "";
      input.placeholder = "model id";
    } else {
      picker.value = "";
      input.style.display = "none";
    }
  }

  function pick(tr, picker) {
    var input = modelInput(tr);
    if (picker.value === OTHER) {
      input.style.display = "";
      input.placeholder = "model id";
      input.focus();
    } else {
      input.value = picker.value;
      input.dataset.picked = "1";
      input.style.display = "none";
    }
  }

  function enhance(tr) {
    addHandle(tr);
    syncPicker(tr, false);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var g = group();
    if (!g) { return; }
    var data = document.getElementById("ocx-declared-models");
    declared = data ? JSON.parse(data.textContent) : {};
    var tbody = g.querySelector("tbody");
    // Rows come back from a failed save in form order: show them in their saved order.
    formRows(tbody)
      .map(function (tr, i) {
        var input = tr.querySelector("input.ocx-position");
        var p = input ? parseInt(input.value, 10) : NaN;
        return { tr: tr, i: i, p: isNaN(p) ? Infinity : p };
      })
      .sort(function (a, b) { return a.p === b.p ? a.i - b.i : (a.p < b.p ? -1 : 1); })
      .forEach(function (row) { move(row.tr, null); });
    formRows(tbody).forEach(enhance);
    var template = tbody.querySelector("tr.empty-form");
    if (template) { addHandle(template); }

    tbody.addEventListener("pointerdown", function (e) {
      var handle = e.target.closest(".ocx-drag");
      if (handle) { startDrag(e, handle.closest("tr")); }
    });
    tbody.addEventListener("keydown", function (e) {
      var handle = e.target.closest(".ocx-drag");
      if (!handle || !e.altKey || (e.key !== "ArrowUp" && e.key !== "ArrowDown")) { return; }
      var tr = handle.closest("tr");
      var rows = formRows(tbody);
      var i = rows.indexOf(tr);
      if (e.key === "ArrowUp" && i > 0) { move(tr, rows[i - 1]); }
      if (e.key === "ArrowDown" && i < rows.length - 1) { move(tr, rows[i + 2] || null); }
      handle.focus();
      e.preventDefault();
    });
    tbody.addEventListener("input", function (e) {
      if (e.target.matches('input[name$="-model"]')) { e.target.dataset.picked = "0"; }
    });
    tbody.addEventListener("change", function (e) {
      var tr = e.target.closest("tr");
      if (!tr) { return; }
      if (e.target.matches('select[name$="-provider"]')) { syncPicker(tr, true); }
      if (e.target.matches("select.ocx-model-select")) { pick(tr, e.target); }
    });
    // Django's inlines.js announces a new row ("Add another …").
    document.addEventListener("formset:added", function (e) {
      if (e.detail && e.detail.formsetName !== "targets") { return; }
      enhance(e.target);
      renumber();
    });
    var form = g.closest("form");
    if (form) { form.addEventListener("submit", renumber); }
  });
})();
