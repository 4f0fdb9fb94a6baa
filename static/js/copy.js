// Copy buttons: <button data-copy="element-id"> copies that element's text (no inline
// script: CSP script-src 'self'). Without JavaScript the text stays selectable.
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-copy]") : null;
    if (!button) { return; }
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) { return; }
    var text = source.textContent;
    var label = button.textContent;
    function done(ok) {
      button.textContent = ok ? "Copied" : "Select and copy it by hand";
      setTimeout(function () { button.textContent = label; }, 2000);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done(true); },
                                               function () { done(false); });
      return;
    }
    var range = document.createRange();
    range.selectNodeContents(source);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    done(ok);
  });
})();
