// Markdown of agent messages and prompts, rendered as DOM nodes built from
// text: nothing the tenant wrote is ever parsed as HTML (no innerHTML), so
// `<img onerror=...>` stays text. Headings, paragraphs, emphasis, code
// spans and fenced blocks, lists, quotes, and links whose address is
// http(s) (any other scheme, `javascript:` included, leaves only the link's
// text). Hand-rolled: a few dozen lines instead of a parser and a sanitizer.

import { h } from "./dom.js";

/** `text` as Markdown, in a `div.md`. */
export function markdown(text: string): HTMLElement {
  const root = h("div", { class: "md" });
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let paragraph: string[] = [];
  let list: HTMLElement | undefined;
  const flush = () => {
    if (paragraph.length) root.append(h("p", {}, ...inline(paragraph.join("\n"))));
    paragraph = [];
    list = undefined;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i] ?? "";
    const fence = /^\s*(```|~~~)\s*([\w+-]*)\s*$/.exec(line);
    if (fence) {
      flush();
      const [, marker = "```", lang = ""] = fence;
      const body: string[] = [];
      for (i++; i < lines.length && !(lines[i] ?? "").trim().startsWith(marker); i++) body.push(lines[i] ?? "");
      root.append(h("pre", {}, h("code", lang ? { "data-lang": lang } : {}, body.join("\n"))));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line);
    if (heading) {
      flush();
      const [, hashes = "#", title = ""] = heading;
      // Below the page's own h1 and h2.
      const level = Math.min(6, hashes.length + 2) as 3 | 4 | 5 | 6;
      root.append(h(`h${level}`, {}, ...inline(title)));
      continue;
    }
    const item = /^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/.exec(line);
    if (item) {
      const [, bullet = "-", content = ""] = item;
      const ordered = /\d/.test(bullet);
      if (paragraph.length) flush();
      if (!list || list.tagName !== (ordered ? "OL" : "UL")) {
        list = h(ordered ? "ol" : "ul", {});
        root.append(list);
      }
      list.append(h("li", {}, ...inline(content)));
      continue;
    }
    const quote = /^\s*>\s?(.*)$/.exec(line);
    if (quote) {
      flush();
      root.append(h("blockquote", {}, ...inline(quote[1] ?? "")));
      continue;
    }
    if (!line.trim()) {
      flush();
      continue;
    }
    if (list && /^\s{2,}\S/.test(line)) {
      // A list item's continued line.
      list.lastElementChild?.append(" ", ...inline(line.trim()));
      continue;
    }
    list = undefined;
    paragraph.push(line);
  }
  flush();
  return root;
}

const INLINE =
  /`([^`\n]+)`|\*\*([^*\n]+)\*\*|(?<!\w)__([^_\s][^_\n]*)__(?!\w)|\*([^*\s][^*\n]*)\*|(?<!\w)_([^_\s][^_\n]*)_(?!\w)|\[([^\]\n]+)\]\(((?:[^()\s]|\([^()\s]*\))+)\)/g;

/** Code spans, strong, emphasis and links within one block. */
function inline(text: string): (Node | string)[] {
  const out: (Node | string)[] = [];
  let at = 0;
  for (const m of text.matchAll(INLINE)) {
    const [all, code, strong1, strong2, em1, em2, label = "", address = ""] = m;
    if (m.index > at) out.push(text.slice(at, m.index));
    at = m.index + all.length;
    if (code !== undefined) out.push(h("code", {}, code));
    else if (strong1 !== undefined || strong2 !== undefined) out.push(h("strong", {}, ...inline(strong1 ?? strong2 ?? "")));
    else if (em1 !== undefined || em2 !== undefined) out.push(h("em", {}, ...inline(em1 ?? em2 ?? "")));
    else {
      const href = safeHref(address);
      out.push(href ? h("a", { href, rel: "noopener noreferrer nofollow" }, ...inline(label)) : label);
    }
  }
  if (at < text.length) out.push(text.slice(at));
  return out;
}

/** The address if it is an absolute http(s) URL, else `undefined`. */
export function safeHref(raw: string): string | undefined {
  try {
    const url = new URL(raw);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : undefined;
  } catch {
    return undefined;
  }
}
