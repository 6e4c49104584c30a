// The usage report (/admin/usage/usagerollup/): its days and hours are counted in the
// browser's time zone. The server renders them in the zone of the `tz` parameter (default
// OCX_TIME_ZONE); on a page without one in another zone than the browser's, this reloads it
// once with the browser's zone (links and the custom form then keep it).
(function () {
  "use strict";
  var zone = "";
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { zone = ""; }

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("ocx-report");
    if (!root || !zone) { return; }
    var params = new URLSearchParams(window.location.search);
    if (!params.get("tz") && root.getAttribute("data-zone") !== zone) {
      params.set("tz", zone);
      window.location.replace(window.location.pathname + "?" + params.toString());
      return;
    }
    var hidden = root.querySelector("#ocx-custom input[name=tz]");
    if (hidden && !hidden.value) { hidden.value = zone; }
  });
})();
