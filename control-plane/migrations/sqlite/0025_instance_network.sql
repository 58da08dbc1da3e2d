-- Live network rules of a sandbox (SandboxService.UpdateNetworkPolicy), as a
-- JSON object {allow_hosts, deny_hosts, changed_by, changed_at, change}: read
-- by every replica's egress at each connection; and their version, counted
-- up by each change (compare-and-set, so two changes never lose one).
ALTER TABLE instances ADD COLUMN network TEXT;
ALTER TABLE instances ADD COLUMN network_version BIGINT NOT NULL DEFAULT 0;
