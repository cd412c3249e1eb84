-- The address other nodes reach a node at (its advertised base URL), sent
-- with every heartbeat; empty when it has none. A sandbox call that reaches
-- a node other than the one holding the sandbox is forwarded there.
ALTER TABLE nodes ADD COLUMN address TEXT NOT NULL DEFAULT '';
