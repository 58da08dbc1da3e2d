// The Sandhold web console: sign-in (an API token in this tab's session, or
// none on a single-user server), then the page of the address.

import { SandholdError } from "@sandhold/client";
import { renderAttempts } from "./attempts.js";
import { h, problem } from "./dom.js";
import { renderRun } from "./run.js";
import { renderRuns } from "./runs.js";
import { NAVIGATED, navigate, route } from "./router.js";
import { renderFiles, renderSandboxes } from "./sandboxes.js";
import { signIn, signOut, token, whoAmI } from "./session.js";
import { renderSnapshots, renderSnapshotThreads } from "./snapshots.js";

const main = document.getElementById("main") as HTMLElement;
const who = document.getElementById("who") as HTMLElement;
let page: AbortController | undefined;

async function start(): Promise<void> {
  let tenant: string | undefined;
  try {
    tenant = await whoAmI();
  } catch (e) {
    main.replaceChildren(h("h1", {}, "Sandhold"), problem(`The server did not answer: ${SandholdError.from(e).message}`));
    return;
  }
  if (tenant === undefined) {
    showSignIn(token() !== undefined);
    return;
  }
  who.replaceChildren(
    `Tenant ${tenant}`,
    token() !== undefined
      ? h(
          "button",
          {
            type: "button",
            class: "link",
            onclick: () => {
              signOut();
              location.assign("/");
            },
          },
          "Sign out",
        )
      : "",
  );
  render();
}

function showSignIn(refused: boolean): void {
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: true });
  const message = h("div", { "aria-live": "assertive" }, refused ? problem("That token was refused.") : "");
  main.replaceChildren(
    h("h1", {}, "Sign in"),
    h(
      "form",
      {
        id: "sign-in",
        class: "sign-in",
        onsubmit: async (e: Event) => {
          e.preventDefault();
          signIn(input.value.trim());
          try {
            if ((await whoAmI()) === undefined) {
              signOut();
              message.replaceChildren(problem("That token was refused."));
              input.focus();
              return;
            }
          } catch (err) {
            signOut();
            message.replaceChildren(problem(`The server did not answer: ${SandholdError.from(err).message}`));
            return;
          }
          void start();
        },
      },
      h("label", { for: "token" }, "API token"),
      input,
      h("p", { class: "muted" }, "Kept in this browser tab's session only."),
      h("button", { type: "submit" }, "Sign in"),
      message,
    ),
  );
  input.focus();
}

function render(): void {
  page?.abort();
  page = new AbortController();
  const signal = page.signal;
  const r = route(location.pathname);
  const section = r.page === "run" || r.page === "runs" || r.page === "attempts" ? "runs" : r.page === "files" || r.page === "sandboxes" ? "sandboxes" : "snapshots";
  for (const a of document.querySelectorAll<HTMLAnchorElement>("[data-nav]")) {
    if (a.dataset.nav === section) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  switch (r.page) {
    case "runs":
      document.title = "Runs · Sandhold";
      return renderRuns(main, signal);
    case "run":
      document.title = `Run ${r.runId} · Sandhold`;
      return renderRun(main, r.runId, signal);
    case "sandboxes":
      document.title = "Sandboxes · Sandhold";
      return renderSandboxes(main, signal);
    case "files":
      document.title = `Sandbox files · Sandhold`;
      return renderFiles(main, r.sandboxId, signal);
    case "snapshot-threads":
      document.title = "Snapshots · Sandhold";
      return renderSnapshotThreads(main, signal);
    case "snapshots":
      document.title = `Snapshots of ${r.threadId} · Sandhold`;
      return renderSnapshots(main, r.threadId, signal);
    case "attempts":
      document.title = `Attempts ${r.setId} · Sandhold`;
      return renderAttempts(main, r.setId, signal);
    case "not-found":
      document.title = "Not found · Sandhold";
      main.replaceChildren(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "/" }, "Runs")));
  }
}

// Links within the console move without a reload; the new page gets focus
// (keyboard and screen reader users land on it).
document.addEventListener("click", (e) => {
  const a = (e.target as Element | null)?.closest?.("a");
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || a.target) return;
  e.preventDefault();
  navigate(url.pathname + url.search);
  main.focus();
});
addEventListener("popstate", render);
addEventListener(NAVIGATED, render);

void start();
