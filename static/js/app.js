// SendDock's only script besides htmx. No inline script anywhere (CSP: script-src 'self').
(function () {
  "use strict";
  // Send the CSRF token with every htmx request that changes something.
  document.addEventListener("htmx:configRequest", function (event) {
    var meta = document.querySelector('meta[name="csrf-token"]');
    if (meta) { event.detail.headers["X-CSRFToken"] = meta.getAttribute("content"); }
  });
  // Polling fragments (data-poll-visible) skip their refresh while the tab is hidden and
  // refresh once as soon as it is visible again.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail.elt;
    if (document.visibilityState === "hidden" && elt && elt.hasAttribute("data-poll-visible")) {
      event.preventDefault();
    }
  });
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState !== "visible" || !window.htmx) { return; }
    document.querySelectorAll("[data-poll-visible]").forEach(function (elt) {
      window.htmx.trigger(elt, "senddock:visible");
    });
  });
  // A message about a campaign's state (data-while-status) goes once the live section
  // shows another state: "Sending started" does not stay on a finished campaign.
  function dropStaleMessages() {
    var live = document.getElementById("campaign-live");
    if (!live) { return; }
    var status = live.getAttribute("data-status");
    document.querySelectorAll("[data-while-status]").forEach(function (elt) {
      if (elt.getAttribute("data-while-status") !== status) { elt.remove(); }
    });
  }
  document.addEventListener("DOMContentLoaded", dropStaleMessages);
  document.addEventListener("htmx:afterSwap", dropStaleMessages);
  // Countdown buttons: <button data-countdown-until="ISO time"> stay disabled until then.
  function tickCountdowns() {
    document.querySelectorAll("[data-countdown-until]").forEach(function (btn) {
      var until = Date.parse(btn.getAttribute("data-countdown-until"));
      var left = Math.ceil((until - Date.now()) / 1000);
      var label = btn.querySelector("[data-countdown-label]");
      if (left > 0) {
        btn.disabled = true;
        if (label) { label.textContent = "(" + left + " s)"; }
      } else {
        btn.disabled = false;
        if (label) { label.textContent = ""; }
        btn.removeAttribute("data-countdown-until");
      }
    });
  }
  setInterval(tickCountdowns, 1000);
  document.addEventListener("DOMContentLoaded", tickCountdowns);
  document.addEventListener("htmx:afterSwap", tickCountdowns);
  // Schedule forms: <input data-tz-offset> gets the browser's UTC offset (minutes) for the
  // chosen local time, so the server can turn the datetime-local value into UTC.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var offset = form && form.querySelector && form.querySelector("[data-tz-offset]");
    var at = form && form.querySelector && form.querySelector("input[type=datetime-local]");
    if (offset && at && at.value) {
      offset.value = String(new Date(at.value).getTimezoneOffset());
    }
  }, true);
  // Copy buttons: <button data-copy="#selector"> copies that element's text.
  document.addEventListener("click", function (event) {
    var btn = event.target && event.target.closest ? event.target.closest("[data-copy]") : null;
    if (!btn) { return; }
    var source = document.querySelector(btn.getAttribute("data-copy"));
    if (!source || !navigator.clipboard) { return; }
    navigator.clipboard.writeText(source.textContent.trim()).then(function () {
      btn.textContent = btn.getAttribute("data-copied") || "Copied";
    });
  });
  // Confirm dangerous actions: <form data-confirm="Really?">.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form && form.hasAttribute && form.hasAttribute("data-confirm") &&
        !window.confirm(form.getAttribute("data-confirm"))) {
      event.preventDefault();
    }
  }, true);
  // "Choose all on this page": <input type="checkbox" data-select-all="FORM-ID"> checks or
  // unchecks every checkbox that belongs to that form (form="FORM-ID").
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box || !box.hasAttribute || !box.hasAttribute("data-select-all")) { return; }
    var form = box.getAttribute("data-select-all");
    document.querySelectorAll('input[type=checkbox][form="' + form + '"]').forEach(function (c) {
      c.checked = box.checked;
    });
  });
  // A narrow window shows the navigation as one row that scrolls sideways: bring the
  // current page's item into view.
  document.addEventListener("DOMContentLoaded", function () {
    var nav = document.querySelector(".mainnav");
    var current = nav && nav.querySelector('[aria-current="page"]');
    if (current && nav.scrollWidth > nav.clientWidth) {
      nav.scrollLeft = current.offsetLeft - (nav.clientWidth - current.offsetWidth) / 2;
    }
  });
  // Wide tables scroll inside their own box (a narrow window must not scroll the page
  // sideways). A table wider than its box says so: shadows on the side with more to see
  // (CSS, .table-scroll), and the box is a labelled region that takes keyboard focus, so
  // arrow keys scroll it. The label comes from <body data-scroll-label>, translated.
  function markWideTables() {
    var label = document.body.getAttribute("data-scroll-label") || "";
    document.querySelectorAll("main table").forEach(function (table) {
      var box = table.parentElement;
      if (!box.classList.contains("table-scroll")) {
        box = document.createElement("div");
        box.className = "table-scroll";
        table.parentElement.insertBefore(box, table);
        box.appendChild(table);
      }
      if (box.scrollWidth > box.clientWidth + 1) {
        box.classList.add("is-wide");
        box.setAttribute("role", "region");
        box.setAttribute("tabindex", "0");
        var caption = table.querySelector("caption");
        box.setAttribute("aria-label", caption ? caption.textContent.trim() + " — " + label : label);
      } else if (box.classList.contains("is-wide")) {
        box.classList.remove("is-wide");
        box.removeAttribute("role");
        box.removeAttribute("tabindex");
        box.removeAttribute("aria-label");
      }
    });
  }
  document.addEventListener("DOMContentLoaded", markWideTables);
  document.addEventListener("htmx:afterSwap", markWideTables);
  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(markWideTables, 150);
  });
})();
