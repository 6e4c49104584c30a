// Routing events for the ocx admin (events page and dashboard): the history is rendered by the
// server; this adds live events from /ws/events at the top of #ocx-event-list, keeps the
// connection indicator (#ocx-conn) honest and reconnects with a growing pause. Every event is
// also dispatched on `document` as "ocx:event" (the dashboard refreshes on it).
(function () {
  "use strict";
  var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
  var MAX_ROWS = 200;

  function node(tag, cls, text) {
    var el = document.createElement(tag);
    if (cls) { el.className = cls; }
    if (text !== undefined) { el.textContent = text; }
    return el;
  }

  function timeNode(ms, cls) {
    var el = node("time", cls);
    el.setAttribute("datetime", new Date(ms).toISOString());
    return el;
  }

  // The same wording as dashboard/_events.html.
  function eventItem(ev) {
    var li = node("li", "ocx-ev ocx-ev-" + (ev.kind || "event"));
    li.appendChild(timeNode(ev.at || Date.now(), "ocx-time"));
    li.appendChild(document.createTextNode(" "));
    li.appendChild(node("span", "ocx-ev-kind", ev.kind || "event"));
    li.appendChild(document.createTextNode(" "));
    var text = node("span", "ocx-ev-text");
    var add = function (s) { text.appendChild(document.createTextNode(s)); };
    if (ev.kind === "cooldown") {
      add("combo/" + ev.combo + ": " + ev.target + " cooling");
      if (ev.until) { add(" until "); text.appendChild(timeNode(ev.until, "ocx-until")); }
      if (ev.reason) { add(" (" + ev.reason + ")"); }
    } else if (ev.kind === "hop") {
      add("combo/" + ev.combo + ": hopped off " + ev.target);
      var why = [ev.status, ev.reason].filter(function (x) { return x; }).join(", ");
      if (why) { add(" (" + why + ")"); }
    } else if (ev.kind === "quota") {
      add(ev.provider + " [" + ev.credential + "]: " + ev.from + " \u2192 " + ev.to);
      if (ev.message) { add(": " + ev.message); } else if (ev.reason) { add(" (" + ev.reason + ")"); }
    } else {
      add(ev.message || ev.kind || "event");
    }
    li.appendChild(text);
    if (window.ocxLocalTime) { window.ocxLocalTime(li); }
    return li;
  }

  function prepend(list, ev) {
    var empty = list.querySelector(".ocx-ev-empty");
    if (empty) { empty.remove(); }
    list.insertBefore(eventItem(ev), list.firstChild);
    var max = parseInt(list.getAttribute("data-max") || MAX_ROWS, 10);
    while (list.children.length > max) { list.removeChild(list.lastChild); }
  }

  function indicate(on, text) {
    var el = document.getElementById("ocx-conn");
    if (!el) { return; }
    el.className = "ocx-conn " + (on ? "ocx-conn-on" : "ocx-conn-off");
    el.textContent = text;
  }

  var pause = 1000;
  function connect() {
    var socket;
    try {
      socket = new WebSocket(scheme + window.location.host + "/ws/events");
    } catch (e) {
      retry();
      return;
    }
    window.ocxEvents.socket = socket;
    socket.onopen = function () {
      pause = 1000;
      indicate(true, "\u25CF live");
      document.dispatchEvent(new CustomEvent("ocx:connected"));
    };
    socket.onmessage = function (message) {
      var ev;
      try { ev = JSON.parse(message.data); } catch (e) { return; }
      var list = document.getElementById("ocx-event-list");
      if (list) { prepend(list, ev); }
      document.dispatchEvent(new CustomEvent("ocx:event", { detail: ev }));
    };
    socket.onclose = function () { retry(); };
  }

  function retry() {
    var seconds = Math.round(pause / 1000);
    indicate(false, "\u25CB disconnected \u2014 reconnecting in " + seconds + " s");
    window.setTimeout(connect, pause);
    pause = Math.min(pause * 2, 15000);
  }

  window.ocxEvents = { eventItem: eventItem, socket: null };
  document.addEventListener("DOMContentLoaded", function () {
    if (document.getElementById("ocx-event-list")) { connect(); }
  });
})();
