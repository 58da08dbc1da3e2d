// Building the page: elements from data with text nodes only (never HTML
// from the server), and small formatting helpers.

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | boolean | number | EventListener | undefined>;

/** `<tag attrs>children</tag>`; `on*` attributes are listeners, `false`/`undefined` leave an attribute out. */
export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === false) continue;
    if (typeof value === "function") el.addEventListener(name.slice(2).toLowerCase(), value);
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  append(el, ...children);
  return el;
}

export function append(el: Element, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === "number" ? String(c) : c);
  }
}

export function when(ms: bigint | number | undefined): string {
  if (ms === undefined || Number(ms) === 0) return "";
  return new Date(Number(ms)).toLocaleString();
}

export function duration(fromMs: bigint | number, toMs?: bigint | number): string {
  const end = toMs === undefined ? Date.now() : Number(toMs);
  const s = Math.max(0, Math.round((end - Number(fromMs)) / 1000));
  return s < 60 ? `${s}s` : `${Math.floor(s / 60)}m ${s % 60}s`;
}

export function bytes(n: bigint | number): string {
  const v = Number(n);
  if (v < 1024) return `${v} B`;
  if (v < 1024 * 1024) return `${(v / 1024).toFixed(1)} KiB`;
  return `${(v / 1024 / 1024).toFixed(1)} MiB`;
}

/** A message in the page's alert region (errors are announced). */
export function problem(text: string): HTMLElement {
  return h("p", { class: "problem", role: "alert" }, text);
}

/** The pieces of a byte stream as one array. */
export function concat(parts: Uint8Array[]): Uint8Array {
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    all.set(p, at);
    at += p.length;
  }
  return all;
}

/** A `<time>` of a moment: its clock time, the full date on hover. */
export function clock(ms: bigint | number): HTMLTimeElement {
  const d = new Date(Number(ms));
  return h("time", { datetime: d.toISOString(), title: d.toLocaleString() }, d.toLocaleTimeString([], { hour12: false }));
}

/** Seconds after a start, as `+1.2s` or `+3m 04s`. */
export function offset(fromMs: bigint | number, atMs: bigint | number): string {
  const ms = Math.max(0, Number(atMs) - Number(fromMs));
  if (ms < 60_000) return `+${(ms / 1000).toFixed(1)}s`;
  const s = Math.floor(ms / 1000);
  return `+${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
}

/** An argv as a shell would read it back: words with anything unusual single-quoted. */
export function shellLine(argv: string[]): string {
  return argv.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replaceAll("'", `'\\''`)}'`)).join(" ");
}

/**
 * Ask before something that cannot be undone: a modal `<dialog>` (the
 * browser keeps focus inside it and Escape dismisses it) whose safe choice
 * has the focus; resolves true only for the confirming button. Focus goes
 * back to what had it.
 */
export function confirmDialog(o: { title: string; body: string; confirm: string; keep: string; id?: string }): Promise<boolean> {
  const before = document.activeElement as HTMLElement | null;
  const titleId = `dialog-title-${Math.random().toString(36).slice(2)}`;
  const dialog = h(
    "dialog",
    { class: "confirm", id: o.id, "aria-labelledby": titleId },
    h(
      "form",
      { method: "dialog" },
      h("h2", { id: titleId }, o.title),
      h("p", {}, o.body),
      h(
        "div",
        { class: "actions" },
        h("button", { type: "submit", value: "keep", class: "secondary", autofocus: true }, o.keep),
        h("button", { type: "submit", value: "confirm", class: "danger" }, o.confirm),
      ),
    ),
  );
  document.body.append(dialog);
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      dialog.remove();
      if (before?.isConnected) before.focus();
      resolve(dialog.returnValue === "confirm");
    });
    dialog.showModal();
  });
}
