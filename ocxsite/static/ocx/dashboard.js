// The ocx dashboard (/admin/): charts from the usage rollups (Chart.js, vendored), and the
// combos + quota section re-rendered by the server whenever /ws/events reports a change
// (events.js dispatches "ocx:event"), when a countdown ends, and every 30 s.
(function () {
  "use strict";
  var PALETTE = ["#2f6fb3", "#d9822b", "#3a9d5d", "#c23b3b", "#7d5ba6", "#8c6d46",
                 "#d36aa8", "#6b7280", "#a3a322", "#1ba3b5", "#4b5dbf", "#b5651d"];
  var root, charts = {}, data = null, range = "1h", dim = "perCombo";
  var liveTimer = null, chartTimer = null, countdownTimer = null;

  function pad(n) { return n < 10 ? "0" + n : String(n); }
  function label(ms) {
    var d = new Date(ms);
    var clock = pad(d.getHours()) + ":" + pad(d.getMinutes());
    return range === "7d" ? pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + clock : clock;
  }
  function color(i) { return PALETTE[i % PALETTE.length]; }

  function baseOptions(extra) {
    var o = {
      responsive: true, maintainAspectRatio: false, animation: false,
      interaction: { mode: "index", intersect: false },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
      scales: { y: { beginAtZero: true, ticks: { precision: 0 } },
                x: { ticks: { maxRotation: 0, autoSkipPadding: 12 } } }
    };
    for (var k in extra) { o[k] = extra[k]; }
    return o;
  }

  function make(id, type, options) {
    var canvas = document.getElementById(id);
    if (!canvas || !window.Chart) { return null; }
    return new window.Chart(canvas, { type: type, data: { labels: [], datasets: [] }, options: options });
  }

  function setEmpty(chart, empty, text) {
    var box = chart.canvas.parentNode;
    var note = box.querySelector(".ocx-chart-empty");
    if (!note) { note = document.createElement("p"); note.className = "ocx-chart-empty"; box.appendChild(note); }
    note.textContent = text;
    note.style.display = empty ? "" : "none";
  }

  function drawSeries(chart, series) {
    var labels = [];
    for (var i = 0; i < data.points; i++) { labels.push(label(data.start + i * data.step)); }
    var groups = data[dim] || {};
    var names = Object.keys(groups);
    var total = 0;
    chart.data.labels = labels;
    chart.data.datasets = names.map(function (name, i) {
      var values = groups[name][series];
      values.forEach(function (v) { total += v; });
      return { label: name, data: values, borderColor: color(i), backgroundColor: color(i),
               borderWidth: 2, pointRadius: 0, tension: 0.2 };
    });
    chart.update("none");
    setEmpty(chart, total === 0, "No " + series + " in the last " + data.range + ".");
  }

  function drawLatency(chart) {
    var rows = data.latency || [];
    chart.data.labels = rows.map(function (r) { return r.target; });
    chart.data.datasets = [
      { label: "latency p50", data: rows.map(function (r) { return r.p50; }), backgroundColor: "#7fb0e0" },
      { label: "latency p95", data: rows.map(function (r) { return r.p95; }), backgroundColor: "#2f6fb3" },
      { label: "TTFT p50", data: rows.map(function (r) { return r.ttftP50; }), backgroundColor: "#f2c28f" },
      { label: "TTFT p95", data: rows.map(function (r) { return r.ttftP95; }), backgroundColor: "#d9822b" }
    ];
    chart.update("none");
    setEmpty(chart, rows.length === 0, "No served requests in the last " + data.range + ".");
  }

  function drawTokens(chart, rows, what) {
    chart.data.labels = rows.map(function (r) { return r.name; });
    chart.data.datasets = [
      { label: "input", data: rows.map(function (r) { return r.input; }), backgroundColor: "#2f6fb3" },
      { label: "output", data: rows.map(function (r) { return r.output; }), backgroundColor: "#3a9d5d" }
    ];
    chart.update("none");
    setEmpty(chart, rows.length === 0, "No tokens reported per " + what + " in the last " + data.range + ".");
  }

  function draw() {
    if (!data) { return; }
    drawSeries(charts.requests, "requests");
    drawSeries(charts.errors, "errors");
    drawSeries(charts.hops, "hops");
    drawLatency(charts.latency);
    drawTokens(charts.users, data.tokensByUser || [], "user");
    drawTokens(charts.models, data.tokensByModel || [], "model");
  }

  function refreshCharts() {
    var url = root.getAttribute("data-charts-url") + "?range=" + encodeURIComponent(range);
    return fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) { if (body && body.range === range) { data = body; draw(); } });
  }

  function scheduleCountdown() {
    // Redraw the states when the soonest cooldown or reset shown has passed.
    if (countdownTimer) { window.clearTimeout(countdownTimer); countdownTimer = null; }
    var now = Date.now(), soonest = null;
    root.querySelectorAll("#ocx-dash-live time.ocx-until").forEach(function (el) {
      var t = new Date(el.getAttribute("datetime")).getTime();
      if (t > now && (soonest === null || t < soonest)) { soonest = t; }
    });
    if (soonest !== null && soonest - now < 3600000) {
      countdownTimer = window.setTimeout(refreshLive, soonest - now + 500);
    }
  }

  function refreshLive() {
    return fetch(root.getAttribute("data-live-url"), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) { return; }
        var box = document.getElementById("ocx-dash-live");
        box.innerHTML = html;
        if (window.ocxLocalTime) { window.ocxLocalTime(box); }
        scheduleCountdown();
      });
  }

  function soon(which, ms) {
    if (which === "live") {
      if (liveTimer) { window.clearTimeout(liveTimer); }
      liveTimer = window.setTimeout(refreshLive, ms);
    } else {
      if (chartTimer) { window.clearTimeout(chartTimer); }
      chartTimer = window.setTimeout(refreshCharts, ms);
    }
  }

  function switcher(id, attr, apply) {
    var box = document.getElementById(id);
    box.addEventListener("click", function (e) {
      var b = e.target.closest("button");
      if (!b) { return; }
      box.querySelectorAll("button").forEach(function (x) { x.classList.toggle("ocx-on", x === b); });
      apply(b.getAttribute(attr));
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    root = document.getElementById("ocx-dashboard");
    if (!root) { return; }
    var initial = document.getElementById("ocx-charts-data");
    data = initial ? JSON.parse(initial.textContent) : null;
    if (data) { range = data.range; }
    var line = baseOptions({});
    charts.requests = make("ocx-chart-requests", "line", line);
    charts.errors = make("ocx-chart-errors", "line", baseOptions({}));
    charts.hops = make("ocx-chart-hops", "line", baseOptions({}));
    // Horizontal bars: every target's name stays readable (vertical bars let Chart.js skip
    // all but a few labels on a narrow chart).
    charts.latency = make("ocx-chart-latency", "bar", baseOptions({
      indexAxis: "y", scales: { y: { ticks: { autoSkip: false } }, x: { beginAtZero: true } } }));
    var horizontal = function () {
      return baseOptions({ indexAxis: "y", scales: { x: { stacked: true, beginAtZero: true },
                                                      y: { stacked: true } } });
    };
    charts.users = make("ocx-chart-users", "bar", horizontal());
    charts.models = make("ocx-chart-models", "bar", horizontal());
    if (!charts.requests) { return; }
    draw();
    scheduleCountdown();
    switcher("ocx-range", "data-range", function (r) { range = r; refreshCharts(); });
    switcher("ocx-dim", "data-dim", function (d) { dim = d; draw(); });
    document.addEventListener("ocx:event", function () { soon("live", 250); soon("charts", 1500); });
    // After a reconnect the page may have missed events: catch up.
    document.addEventListener("ocx:connected", function () { soon("live", 100); soon("charts", 100); });
    window.setInterval(refreshCharts, 15000);
    window.setInterval(refreshLive, 30000);
    window.ocxDashboard = {
      charts: charts,
      data: function () { return data; },
      refreshCharts: refreshCharts,
      refreshLive: refreshLive
    };
  });
})();
