-- The SQLite claim schema as dibs schema version 1 made it (frozen).

CREATE TABLE IF NOT EXISTS dibs_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dibs_claims (
    -- The rowid: SQLite gives max + 1, and sweep never purges the highest
    -- row, so a fence is never reused (cheaper than AUTOINCREMENT's extra table).
    fence      INTEGER PRIMARY KEY,                -- also the claim ID
    holder     TEXT NOT NULL,
    targets    TEXT NOT NULL,                      -- canonical JSON
    state      TEXT NOT NULL,
    expires_at INTEGER,                            -- µs since the epoch, store clock
    taken_over INTEGER NOT NULL DEFAULT 0,
    request_id TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS dibs_claims_by_holder
    ON dibs_claims (holder) WHERE state IN ('held', 'confirmed');
CREATE INDEX IF NOT EXISTS dibs_claims_held
    ON dibs_claims (expires_at) WHERE state = 'held';
CREATE INDEX IF NOT EXISTS dibs_claims_ended
    ON dibs_claims (updated_at) WHERE state IN ('released', 'expired');
-- One row per unit of a live claim, or of a dead hold until a claimant takes
-- it over or the sweep purges it (the reason rule): the unique key is the arbiter.
CREATE TABLE IF NOT EXISTS dibs_units (
    resource TEXT NOT NULL,
    slot     TEXT NOT NULL,
    fence    INTEGER NOT NULL,
    PRIMARY KEY (resource, slot)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dibs_spans (
    resource TEXT NOT NULL,
    lo       NOT NULL,                             -- numbers, or µs for datetimes
    hi       NOT NULL,
    kind     TEXT NOT NULL,
    fence    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS dibs_spans_by_resource ON dibs_spans (resource, lo);
CREATE TABLE IF NOT EXISTS dibs_requests (
    request_id  TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    fence       INTEGER,                           -- the granted claim, or NULL
    taken       TEXT,                              -- JSON targets when lost
    created_at  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dibs_requests_by_age ON dibs_requests (created_at);
