// Who the console calls as: an API token kept in sessionStorage (this tab
// only, gone when it closes), or none on a single-user server.

import { SandholdClient, SandholdError } from "@sandhold/client";

const KEY = "sandhold.token";

export function token(): string | undefined {
  return sessionStorage.getItem(KEY) ?? undefined;
}

export function signIn(value: string): void {
  sessionStorage.setItem(KEY, value);
}

export function signOut(): void {
  sessionStorage.removeItem(KEY);
}

/** The client of this page's server, with the session's token. */
export const client = new SandholdClient({ baseUrl: location.origin, token });

/** The caller's tenant, or `undefined` when a token is needed (missing or refused). */
export async function whoAmI(): Promise<string | undefined> {
  try {
    return (await client.serverInfo()).tenant;
  } catch (e) {
    if (e instanceof SandholdError && e.reason === "UNAUTHENTICATED") return undefined;
    throw e;
  }
}
