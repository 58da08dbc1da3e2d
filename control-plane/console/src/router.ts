// Addresses are the interface (`/runs/<run_id>` is a run): links within the
// console change the address without reloading, and the page follows it.

export const NAVIGATED = "sandhold:navigate";

/** Go to an address of the console. */
export function navigate(to: string): void {
  history.pushState(null, "", to);
  dispatchEvent(new Event(NAVIGATED));
}

export type Route =
  | { page: "runs" }
  | { page: "run"; runId: string }
  | { page: "sandboxes" }
  | { page: "files"; sandboxId: string }
  | { page: "snapshot-threads" }
  | { page: "snapshots"; threadId: string }
  | { page: "attempts"; setId: string }
  | { page: "not-found" };

export function route(pathname: string): Route {
  const parts = pathname.split("/").filter(Boolean).map(decodeURIComponent);
  const [a, b, c] = parts;
  if (parts.length === 0) return { page: "runs" };
  if (a === "runs" && b && parts.length === 2) return { page: "run", runId: b };
  if (a === "sandboxes" && parts.length === 1) return { page: "sandboxes" };
  if (a === "sandboxes" && b && parts.length === 2) return { page: "files", sandboxId: b };
  if (a === "snapshots" && parts.length === 1) return { page: "snapshot-threads" };
  if (a === "threads" && b && c === "snapshots" && parts.length === 3) return { page: "snapshots", threadId: b };
  if (a === "attempts" && b && parts.length === 2) return { page: "attempts", setId: b };
  return { page: "not-found" };
}
