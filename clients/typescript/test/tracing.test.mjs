// The trace context on calls: a fake OpenTelemetry API (a propagator that
// writes a fixed traceparent) stands in for @opentelemetry/api, which the
// package does not require.

import assert from "node:assert/strict";
import { test } from "node:test";

import { traceContext } from "../dist/index.js";

const TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const active = { span: "the caller's" };
const fakeApi = {
  context: { active: () => active },
  propagation: {
    inject(context, carrier, setter) {
      if (context === active) setter.set(carrier, "traceparent", TRACEPARENT);
    },
  },
};

async function headersSent(interceptor) {
  let sent;
  const next = async (req) => {
    sent = req.header;
    return {};
  };
  await interceptor(next)({ header: new Headers() });
  return sent;
}

test("the active context's traceparent goes on each call", async () => {
  const headers = await headersSent(traceContext(fakeApi));
  assert.equal(headers.get("traceparent"), TRACEPARENT);
});

test("off, or without @opentelemetry/api installed, nothing is added", async () => {
  assert.equal((await headersSent(traceContext(false))).get("traceparent"), null);
  // This package's tests do not install @opentelemetry/api.
  assert.equal((await headersSent(traceContext())).get("traceparent"), null);
});
