// The run page's live part: while the run goes on, fetch the part again every second and
// put it in place when it changed. The server renders it (escaped); nothing here builds
// markup from data, and the page's CSP runs no inline script.
(function () {
  "use strict";
  var INTERVAL_MS = 1000;

  function current() {
    return document.getElementById("live");
  }

  function refresh() {
    var live = current();
    if (!live || live.getAttribute("data-open") !== "1") {
      return;
    }
    fetch(live.getAttribute("data-live-url"), { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        var now = current();
        if (fresh && now && fresh.getAttribute("data-version") !== now.getAttribute("data-version")) {
          now.replaceWith(document.importNode(fresh, true));
        }
      })
      .catch(function () {
        /* the console is gone or restarting: try again at the next tick */
      })
      .then(function () {
        setTimeout(refresh, INTERVAL_MS);
      });
  }

  setTimeout(refresh, INTERVAL_MS);
})();
