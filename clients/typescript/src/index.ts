// @sandhold/client: Sandhold's public API (sandhold.v1) for TypeScript.
export { SandholdClient, wrap } from "./client.js";
export type { SandholdClientOptions, RunItem, RunStream, AttachOptions, StartOptions, StartRunInit } from "./client.js";
export * from "./chunks.js";
export { traceContext, injectTraceContext } from "./tracing.js";
export type { OtelApi } from "./tracing.js";
export { SandholdError, ERROR_REASONS, ERROR_DOMAIN, isErrorReason, Code } from "./errors.js";
export type { ErrorReason } from "./errors.js";
export * from "./gen/sandhold/v1/admin_pb.js";
export * from "./gen/sandhold/v1/events_pb.js";
export * from "./gen/sandhold/v1/run_pb.js";
export * from "./gen/sandhold/v1/sandbox_pb.js";
export * from "./gen/sandhold/v1/snapshot_pb.js";
export { ErrorReason as ErrorReasonEnum, ErrorReasonSchema } from "./gen/sandhold/v1/errors_pb.js";
export { create, toJson, fromJson } from "@bufbuild/protobuf";
