// The key admin: "Add another budget" (a copy of the last budget row, emptied) and the secret
// page's Copy button. Loaded as a file (no inline script: OCX_CSP may forbid them).
"use strict";
(function () {
  function addBudgetRow(button) {
    const rows = button.closest(".ocx-budget-rows").querySelectorAll(".ocx-budget-row");
    const last = rows[rows.length - 1];
    const copy = last.cloneNode(true);
    copy.querySelectorAll("input").forEach((el) => { el.value = ""; });
    last.after(copy);
    copy.querySelector("input").focus();
  }

  async function copySecret(button) {
    const field = document.getElementById(button.dataset.copy);
    const status = button.parentElement.querySelector(".ocx-copied");
    let done = false;
    if (navigator.clipboard && window.isSecureContext) {
      try {
        await navigator.clipboard.writeText(field.value);
        done = true;
      } catch (err) {
        done = false;
      }
    }
    if (!done) {
      // Plain http on a LAN address has no clipboard API: copy the selection instead.
      field.select();
      done = document.execCommand("copy");
    }
    if (status) status.textContent = done ? "Copied" : "Select the secret and copy it";
  }

  document.addEventListener("click", (event) => {
    const add = event.target.closest(".ocx-add-budget");
    if (add) {
      event.preventDefault();
      addBudgetRow(add);
      return;
    }
    const copy = event.target.closest(".ocx-copy");
    if (copy) {
      event.preventDefault();
      copySecret(copy);
    }
  });
})();
