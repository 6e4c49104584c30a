// Live routing events for the ocx admin: badges refresh and the events list grows as
// cooldowns, hops and quota transitions happen (pushed over /ws/events).
(function () {
  "use strict";
  var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";

  function refreshBadges() {
    document.querySelectorAll(".ocx-live[data-combo]").forEach(function (box) {
      var combo = box.getAttribute("data-combo");
      fetch("/api/status?combo=" + encodeURIComponent(combo), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (report) {
          if (!report || !report.combos.length) { return; }
          report.combos[0].targets.forEach(function (t) {
            var el = box.querySelector('[data-target="' + t.target + '"]');
            if (!el) { return; }
            // The server renders the label (eligibility.target_state, PRODUCT §8.7).
            el.className = "ocx-badge ocx-" + t.state;
            el.title = t.detail || "";
            el.textContent = t.target + ": " + t.label;
            var cut = t.label.indexOf(" until ");
            if (t.until && cut >= 0) {
              // The end time in the browser's zone, counting down (ocx/localtime.js).
              el.textContent = t.target + ": " + t.label.slice(0, cut + 7);
              var time = document.createElement("time");
              time.className = "ocx-until";
              time.setAttribute("datetime", t.until);
              time.textContent = t.label.slice(cut + 7);
              el.appendChild(time);
              if (window.ocxLocalTime) { window.ocxLocalTime(el); }
            }
          });
        });
    });
  }

  function addEvent(event) {
    var list = document.getElementById("ocx-events");
    if (!list) { return; }
    var item = document.createElement("li");
    var when = new Date(event.at || event.until || Date.now()).toISOString();
    var text = event.message ||
      (event.kind === "cooldown"
        ? "combo/" + event.combo + ": " + event.target + " cooling until " +
          new Date(event.until).toISOString() + " (" + event.reason + ")"
        : JSON.stringify(event));
    item.textContent = when + "  " + text;
    list.insertBefore(item, list.firstChild);
  }

  function connect() {
    var socket = new WebSocket(scheme + window.location.host + "/ws/events");
    socket.onmessage = function (message) {
      var event = JSON.parse(message.data);
      addEvent(event);
      refreshBadges();
    };
    socket.onclose = function () { window.setTimeout(connect, 3000); };
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (document.querySelector(".ocx-live, #ocx-events")) { connect(); }
  });
})();
