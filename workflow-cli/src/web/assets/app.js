// workflow dashboard: live refresh and a confirmation before cancelling. Pages work without it.
"use strict";
(function () {
  var live = document.getElementById("live");
  var toggle = document.getElementById("live-toggle");
  var status = document.getElementById("live-status");
  var EVERY_MS = 2000;
  var busy = false;

  // The one-off message after an action should not come back on reload.
  if (/[?&](notice|error)=/.test(location.search)) {
    var url = new URL(location.href);
    url.searchParams.delete("notice");
    url.searchParams.delete("error");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }

  if (toggle) {
    toggle.checked = localStorage.getItem("workflow.live") !== "off";
    toggle.addEventListener("change", function () {
      localStorage.setItem("workflow.live", toggle.checked ? "on" : "off");
      if (toggle.checked) refresh();
    });
  }

  // Never replace the page under someone typing a payload or choosing a filter.
  function editing() {
    var a = document.activeElement;
    if (a && live.contains(a) && /^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName)) return true;
    var areas = live.querySelectorAll("textarea");
    for (var i = 0; i < areas.length; i++) {
      if (areas[i].value !== areas[i].defaultValue) return true;
    }
    return false;
  }

  function refresh() {
    if (!live || !toggle || !toggle.checked || busy || document.hidden || editing()) return;
    busy = true;
    fetch(location.href, { cache: "no-store", headers: { "X-Live-Refresh": "1" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        var next = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        if (next && !editing()) {
          live.innerHTML = next.innerHTML;
          live.dispatchEvent(new CustomEvent("workflow:refreshed"));
        }
        if (status) status.textContent = "";
      })
      .catch(function (e) {
        if (status) status.textContent = "refresh failed (" + e.message + ")";
      })
      .finally(function () {
        busy = false;
      });
  }
  setInterval(refresh, EVERY_MS);

  document.addEventListener("submit", function (ev) {
    var msg = ev.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) ev.preventDefault();
  });
})();
