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

// Local-time tooltips and copy buttons. The server renders every time in UTC inside
// <time datetime="…">; this adds the reader's local time as the title. Elements with
// data-copy="text" get a small "Copy" button after them. Both are progressive: without
// JavaScript the page shows UTC and the text can be selected by hand. No inline script or
// style is used, so the Content-Security-Policy stays strict.
(function () {
  "use strict";

  function localTitles(root) {
    var els = root.querySelectorAll("time[datetime]");
    for (var i = 0; i < els.length; i++) {
      var el = els[i], iso = el.getAttribute("datetime");
      if (!iso || el.hasAttribute("data-local")) continue;
      var d = new Date(iso);
      if (isNaN(d.getTime())) continue;
      el.setAttribute("title", "Your local time: " + d.toLocaleString());
      el.setAttribute("data-local", "1");
    }
  }

  function copyButtons(root) {
    var els = root.querySelectorAll("[data-copy]");
    for (var i = 0; i < els.length; i++) {
      var el = els[i];
      if (el.hasAttribute("data-copy-ready") || !navigator.clipboard) continue;
      el.setAttribute("data-copy-ready", "1");
      var btn = document.createElement("button");
      btn.type = "button";
      btn.className = "btn btn--copy";
      btn.textContent = "Copy";
      btn.setAttribute("aria-label", "Copy " + (el.getAttribute("data-copy-label") || "value"));
      btn.setAttribute("data-testid", "copy-button");
      (function (el, btn) {
        btn.addEventListener("click", function () {
          var text = el.getAttribute("data-copy") || el.textContent.trim();
          navigator.clipboard.writeText(text).then(function () {
            btn.textContent = "Copied";
            window.setTimeout(function () { btn.textContent = "Copy"; }, 1500);
          });
        });
      })(el, btn);
      el.insertAdjacentElement("afterend", btn);
    }
  }

  // The queue's bulk form: the header's "select every row on this page" box (hidden without
  // JavaScript, where it could do nothing) and the count of ticked rows beside "The selected
  // rows", so an operator sees how many a job will take before submitting.
  function bulkSelection(root) {
    var all = root.querySelector("[data-select-all]");
    var count = root.querySelector("[data-bulk-count]");
    var boxes = root.querySelectorAll('input[name="operation_ids"][form="bulk-form"]');
    if (!all || !boxes.length || all.hasAttribute("data-ready")) return;
    all.setAttribute("data-ready", "1");
    function update() {
      var n = 0;
      for (var i = 0; i < boxes.length; i++) if (boxes[i].checked) n++;
      if (count) count.textContent = n + " selected";
      all.checked = n === boxes.length;
      all.indeterminate = n > 0 && n < boxes.length;
    }
    all.hidden = false;
    all.addEventListener("change", function () {
      for (var i = 0; i < boxes.length; i++) boxes[i].checked = all.checked;
      update();
    });
    for (var i = 0; i < boxes.length; i++) boxes[i].addEventListener("change", update);
    update();
  }

  function enhance() {
    localTitles(document);
    copyButtons(document);
    bulkSelection(document);
  }

  document.addEventListener("htmx:afterSettle", enhance);
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", enhance);
  } else {
    enhance();
  }
})();
