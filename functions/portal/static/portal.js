// Progressive enhancement only: every page works without this script.
// - [data-progress-url]: the progress line refreshes every second; the page reloads when
//   the workspace's state changes (so the buttons follow it).
// - [data-copy]: copies the named input's value (the link URL shown once).
(function () {
  "use strict";
  function follow(el) {
    var shown = el.getAttribute("data-state");
    function tick() {
      fetch(el.getAttribute("data-progress-url"), {credentials: "same-origin", cache: "no-store"})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (body) {
          if (!body) { return; }
          if (body.state !== shown) { window.location.reload(); return; }
          var line = body.progress ? body.progress.line : body.state.toLowerCase() + "…";
          el.textContent = line;
          if (body.progress && body.progress.total_bytes) {
            var bar = document.createElement("progress");
            bar.max = body.progress.total_bytes;
            bar.value = body.progress.done_bytes;
            el.appendChild(document.createTextNode(" "));
            el.appendChild(bar);
          }
        })
        .catch(function () {})
        .then(function () { window.setTimeout(tick, 1000); });
    }
    window.setTimeout(tick, 1000);
  }
  function copy(button) {
    button.addEventListener("click", function () {
      var input = document.getElementById(button.getAttribute("data-copy"));
      if (!input) { return; }
      input.select();
      var done = function () { button.textContent = "Copied"; };
      if (navigator.clipboard) {
        navigator.clipboard.writeText(input.value).then(done, function () {
          document.execCommand("copy"); done();
        });
      } else { document.execCommand("copy"); done(); }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-progress-url]"), follow);
    Array.prototype.forEach.call(document.querySelectorAll("[data-copy]"), copy);
  });
})();
