-- Snapshot blobs are per tenant: a blob is (tenant, sha256), so a tenant's
-- checkpoint can reference only bytes that tenant uploaded (and the
-- control plane hashed), and de-duplication cannot tell one tenant what
-- another stored.
--
-- Existing blobs: each is copied to every tenant whose checkpoints
-- reference it, so every existing checkpoint still restores. Blobs no
-- checkpoint references (garbage, or the uploads of a save in flight
-- during the upgrade) are dropped, as the next sweep would have. A
-- reference made before this migration is kept as it is: it cannot tell a
-- tenant's own upload from a hash claimed across tenants. Pins name the
-- tenant whose blobs they protect; pins of saves in flight during the
-- upgrade get no tenant and protect nothing (as if expired).

ALTER TABLE snapshot_blob_pins ADD COLUMN tenant TEXT NOT NULL DEFAULT '';

CREATE TABLE snapshot_tenant_blobs (
    tenant     TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    size       BIGINT NOT NULL,
    data       BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, sha256)
);

INSERT INTO snapshot_tenant_blobs (tenant, sha256, size, data, created_at)
SELECT owners.tenant, b.sha256, b.size, b.data, b.created_at
FROM snapshot_blobs b
JOIN (
    SELECT DISTINCT c.tenant, r.sha256
    FROM snapshot_blob_refs r
    JOIN snapshot_checkpoints c ON c.checkpoint_id = r.checkpoint_id
) AS owners ON owners.sha256 = b.sha256;

DROP TABLE snapshot_blobs;
ALTER TABLE snapshot_tenant_blobs RENAME TO snapshot_blobs;
