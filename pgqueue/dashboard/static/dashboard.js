// pgqueue dashboard: live refresh over server-sent events, selection helpers.
// No build step; htmx (vendored next to this file) does the swapping.
(function () {
  "use strict";
  var body = document.body;
  var eventsUrl = body.getAttribute("data-events-url");
  var busy = function () {
    // Never pull the page from under someone selecting rows or typing.
    return document.querySelector("#live input:checked, #live :focus, .progress-running");
  };
  if (eventsUrl && window.EventSource) {
    var source = new EventSource(eventsUrl);
    var last = 0;
    source.addEventListener("refresh", function () {
      var now = Date.now();
      if (now - last < 1000 || busy()) { return; }
      last = now;
      htmx.trigger(body, "pgqueue-refresh");
    });
    source.addEventListener("open", function () { body.classList.add("live-on"); });
    source.addEventListener("error", function () { body.classList.remove("live-on"); });
  }
  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target && target.matches("input[data-select-all]")) {
      document.querySelectorAll("input[name=job_id]").forEach(function (box) {
        box.checked = target.checked;
      });
    }
  });
  document.addEventListener("submit", function (event) {
    var message = event.target.getAttribute("data-confirm");
    if (message && !window.confirm(message)) { event.preventDefault(); }
  });
})();
