// Times on ocx admin pages in the browser's own time zone (combos/times.py renders them):
// <time class="ocx-time" datetime=ISO> -> "2026-12-01 14:05:03" and
// <time class="ocx-until" datetime=ISO> -> "14:05:03 (in 42 s)", counting down each second.
// window.ocxLocalTime(root) redraws the times under `root` (live.js calls it after a redraw).
(function () {
  "use strict";

  function pad(n) { return n < 10 ? "0" + n : String(n); }
  function day(d) { return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()); }
  function clock(d) { return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()); }

  function inWords(seconds) {
    var s = Math.max(0, Math.round(seconds));
    if (s < 60) { return s + " s"; }
    if (s < 3600) { return Math.floor(s / 60) + " min" + (s % 60 ? " " + (s % 60) + " s" : ""); }
    if (s < 86400) { return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min"; }
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }

  var zone = "";
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { zone = ""; }

  function render(el, now) {
    var d = new Date(el.getAttribute("datetime"));
    if (isNaN(d.getTime())) { return; }
    el.title = d.toISOString().replace(".000Z", "Z") + " UTC" + (zone ? " \u2014 shown in " + zone : "");
    if (el.classList.contains("ocx-until")) {
      var left = (d.getTime() - now.getTime()) / 1000;
      var when = day(d) === day(now) ? clock(d) : day(d) + " " + clock(d);
      el.textContent = when + " (" + (left > 0 ? "in " + inWords(left) : "passed") + ")";
    } else {
      el.textContent = day(d) + " " + clock(d);
    }
  }

  function redraw(root) {
    var now = new Date();
    (root || document).querySelectorAll("time.ocx-time, time.ocx-until").forEach(function (el) {
      render(el, now);
    });
  }

  window.ocxLocalTime = redraw;
  document.addEventListener("DOMContentLoaded", function () {
    redraw(document);
    // Countdowns tick (also those a live redraw adds later).
    window.setInterval(function () {
      var now = new Date();
      document.querySelectorAll("time.ocx-until").forEach(function (el) { render(el, now); });
    }, 1000);
  });
})();
