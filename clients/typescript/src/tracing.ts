// W3C trace context on every call, when the application uses OpenTelemetry:
// `@opentelemetry/api` is an optional peer dependency, loaded if installed,
// so a caller's trace continues into the server's spans. Without it (or in a
// page that does not bundle it) nothing is added.

import type { Interceptor } from "@connectrpc/connect";

/** The part of `@opentelemetry/api` used here. */
export interface OtelApi {
  context: { active(): unknown };
  propagation: {
    inject(context: unknown, carrier: Headers, setter: { set(carrier: Headers, key: string, value: string): void }): void;
  };
}

const setter = { set: (carrier: Headers, key: string, value: string) => carrier.set(key, value) };

/** Put the active context's `traceparent` (and `tracestate`) on `headers`. */
export function injectTraceContext(api: OtelApi, headers: Headers): void {
  api.propagation.inject(api.context.active(), headers, setter);
}

// A name in a variable: bundlers leave the import to run time, where a
// missing package is simply no tracing.
const OTEL_API = "@opentelemetry/api";
let loaded: Promise<OtelApi | undefined> | undefined;

function installedApi(): Promise<OtelApi | undefined> {
  loaded ??= import(/* @vite-ignore */ OTEL_API).then(
    (m: OtelApi & { default?: OtelApi }) => (m.propagation ? m : m.default),
    () => undefined,
  );
  return loaded;
}

/**
 * An interceptor adding the trace context. `api`: the OpenTelemetry API to
 * use; `undefined` loads `@opentelemetry/api` if installed; `false` turns it off.
 */
export function traceContext(api?: OtelApi | false): Interceptor {
  return (next) => async (req) => {
    const otel = api === false ? undefined : (api ?? (await installedApi()));
    if (otel) injectTraceContext(otel, req.header);
    return next(req);
  };
}
