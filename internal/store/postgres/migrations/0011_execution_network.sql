-- What an execution with a network reached: its allowlist, bytes,
-- connections and last attempts (JSON, execution.NetworkRecord); empty
-- for the executions without one, which is all of them before egress.
ALTER TABLE executions ADD COLUMN network TEXT NOT NULL DEFAULT '';
-- The bytes the egress proxies carried for a tenant's executions and its
-- sandboxes that stay, in and out, metered on the day an execution's
-- result is saved or a sandbox's live period closes.
ALTER TABLE usage_days ADD COLUMN network_bytes_in BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_days ADD COLUMN network_bytes_out BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_days ADD COLUMN sbx_network_bytes_in BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_days ADD COLUMN sbx_network_bytes_out BIGINT NOT NULL DEFAULT 0;
