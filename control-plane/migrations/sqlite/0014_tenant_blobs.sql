-- Snapshot blobs are per tenant: a blob is (tenant, sha256), so a save's
-- pins name the tenant whose blobs they protect. Pins of saves in flight
-- during the upgrade get no tenant and protect nothing (as if expired).
-- The blob files themselves move to per-tenant directories when the
-- store opens (`DirBlobStore::adopt_legacy`).

ALTER TABLE snapshot_blob_pins ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
