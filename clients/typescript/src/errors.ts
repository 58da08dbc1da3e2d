// Errors of the Sandhold API as one typed class: the gRPC code and the
// stable `reason` every Sandhold error carries in a google.rpc.ErrorInfo
// detail (domain "sandhold.dev"); proto/sandhold/v1/errors.proto lists them.

import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** Every reason the server sends; `test/errors.test.mjs` keeps it in step with errors.proto. */
export const ERROR_REASONS = [
  "INVALID_ARGUMENT",
  "NOT_FOUND",
  "ALREADY_EXISTS",
  "UNAUTHENTICATED",
  "PERMISSION_DENIED",
  "JOURNAL_STALLED",
  "RUN_TERMINAL",
  "CLAIM_LOST",
  "REPLAY_DIVERGED",
  "UNSUPPORTED",
  "UNAVAILABLE",
  "DEADLINE_EXCEEDED",
  "INTERNAL",
  "FAILED_PRECONDITION",
  "LEASE_LOST",
  "CANCELLED",
  "SNAPSHOT_UNSUPPORTED_ENTRY",
  "SNAPSHOT_WRITER_LOST",
  "SNAPSHOT_STALE_HEAD",
  "PROTOCOL_MISMATCH",
  "UNIMPLEMENTED",
  "RESOURCE_EXHAUSTED",
  "LINE_TOO_LONG",
  "SECRETS_MISSING",
  "SNAPSHOT_TOO_LARGE",
  "JOURNAL_FULL",
  "STORAGE_FULL",
  "MODEL_UNREACHABLE",
  "BUDGET_EXCEEDED",
  "SANDBOX_LOST",
] as const;

/** A stable error reason of the Sandhold API. */
export type ErrorReason = (typeof ERROR_REASONS)[number];

/** The domain of Sandhold's ErrorInfo details. */
export const ERROR_DOMAIN = "sandhold.dev";

/**
 * A failed call. `reason` is Sandhold's, or `"TRANSPORT"` when the answer
 * did not come from Sandhold (a dropped connection, a proxy, a refused
 * origin) and carries no reason.
 */
export class SandholdError extends Error {
  override readonly name = "SandholdError";
  constructor(
    /** The gRPC status code. */
    readonly code: Code,
    readonly reason: ErrorReason | "TRANSPORT",
    message: string,
    /** ErrorInfo metadata (e.g. `max` of JOURNAL_FULL). */
    readonly metadata: Readonly<Record<string, string>> = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  /** `e` as a SandholdError (a ConnectError's details decoded). */
  static from(e: unknown): SandholdError {
    if (e instanceof SandholdError) return e;
    const ce = ConnectError.from(e);
    const info = ce.findDetails(ErrorInfoSchema).find((i) => i.domain === ERROR_DOMAIN);
    const reason = info && isErrorReason(info.reason) ? info.reason : "TRANSPORT";
    return new SandholdError(ce.code, reason, ce.rawMessage, info?.metadata ?? {}, { cause: e });
  }
}

export function isErrorReason(s: string): s is ErrorReason {
  return (ERROR_REASONS as readonly string[]).includes(s);
}

export { Code };
