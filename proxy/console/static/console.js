// The console's one script: copy buttons, confirmations before deleting, and a back link.
// Served by the gateway (the page's Content-Security-Policy allows no other script).
"use strict";
document.addEventListener("click", (event) => {
  const copy = event.target.closest("[data-copy]");
  if (copy) {
    const source = document.getElementById(copy.dataset.copy);
    if (source && navigator.clipboard) {
      navigator.clipboard.writeText(source.textContent.trim()).then(() => {
        copy.textContent = "Copied";
        setTimeout(() => { copy.textContent = "Copy"; }, 2000);
      });
    }
  }
  const back = event.target.closest("[data-back]");
  if (back) {
    event.preventDefault();
    history.back();
  }
});
document.addEventListener("submit", (event) => {
  const message = event.target.dataset.confirm;
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
});
