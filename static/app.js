// idemgate dashboard: live TTL countdowns. Progressive enhancement only: the server renders
// every TTL, and this script just keeps the numbers moving. Counting starts from the
// remaining time the server computed on the database clock, not from the browser's clock,
// so a skewed client clock changes nothing.
(function () {
  "use strict";

  function format(ms) {
    var s = Math.ceil(ms / 1000);
    if (s <= 0) return "expired";
    var d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    var m = Math.floor((s % 3600) / 60), sec = s % 60;
    if (d > 0) return d + "d " + h + "h";
    if (h > 0) return h + "h " + String(m).padStart(2, "0") + "m";
    if (m > 0) return m + "m " + String(sec).padStart(2, "0") + "s";
    return sec + "s";
  }

  // Each start (page load, and every htmx refresh of the table) begins a new generation; the
  // previous generation's loop stops, so refreshes never pile up timers on detached nodes.
  var generation = 0;

  function start() {
    var gen = ++generation;
    var started = performance.now();
    var els = Array.prototype.slice.call(document.querySelectorAll("[data-ttl-ms]"));
    if (els.length === 0) return;
    var items = els.map(function (el) {
      return { el: el, ms: parseInt(el.getAttribute("data-ttl-ms"), 10) || 0, done: false };
    });
    function tick() {
      if (gen !== generation) return;
      var elapsed = performance.now() - started, live = 0;
      items.forEach(function (it) {
        if (it.done) return;
        var left = it.ms - elapsed;
        it.el.textContent = format(left);
        if (left <= 0) {
          it.done = true;
          it.el.classList.remove("ttl--live");
          it.el.classList.add("ttl--expired");
        } else {
          live++;
        }
      });
      if (live > 0) window.setTimeout(tick, 1000 - (elapsed % 1000));
    }
    tick();
  }

  document.addEventListener("htmx:afterSettle", start);

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();

// Copy buttons: <button data-copy-target="ID"> copies the text of element ID (e.g. a secret
// shown once) to the clipboard. Without JavaScript or clipboard access the text stays
// selectable by hand.
(function () {
  "use strict";
  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest ? ev.target.closest("[data-copy-target]") : null;
    if (!btn || !navigator.clipboard) return;
    var el = document.getElementById(btn.getAttribute("data-copy-target"));
    if (!el) return;
    navigator.clipboard.writeText(el.textContent.trim()).then(function () {
      btn.textContent = "Copied";
    });
  });
})();
