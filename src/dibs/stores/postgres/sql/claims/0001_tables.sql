-- Version 1: the claim tables, sequences and indexes; {s} is the store's schema.

CREATE TABLE {s}.meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
CREATE SEQUENCE {s}.claim_ids AS bigint;
CREATE SEQUENCE {s}.fences AS bigint;
CREATE TABLE {s}.claims (
    id         bigint PRIMARY KEY,
    holder     text NOT NULL,
    targets    text NOT NULL,                -- canonical JSON (dibs._model.targets_to_text)
    state      text NOT NULL CHECK (state IN ('held', 'confirmed', 'released', 'expired')),
    fence      bigint NOT NULL,
    expires_at timestamptz,
    taken_over boolean NOT NULL DEFAULT false,
    request_id text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CHECK (state <> 'held' OR expires_at IS NOT NULL),
    CHECK (state <> 'confirmed' OR expires_at IS NULL)
);
CREATE INDEX claims_live_by_holder ON {s}.claims (holder) WHERE state IN ('held', 'confirmed');
CREATE INDEX claims_held_by_expiry ON {s}.claims (expires_at) WHERE state = 'held';
CREATE INDEX claims_ended ON {s}.claims (updated_at) WHERE state IN ('released', 'expired');

-- One row per unit of a live claim (or of a dead hold not yet taken over or
-- swept). The primary key is the arbiter: the insert is the check.
-- expires_at mirrors the claim's, so liveness is judged on this row alone.
CREATE TABLE {s}.units (
    resource   text NOT NULL,
    slot       text NOT NULL,
    claim_id   bigint NOT NULL,
    expires_at timestamptz,
    PRIMARY KEY (resource, slot)
);
CREATE INDEX units_by_claim ON {s}.units (claim_id);

-- Half-open spans as numranges: numbers exactly, datetimes as µs since the
-- epoch. The first exclusion constraint forbids overlap on a resource; the
-- second forbids mixing numbers and datetimes on one.
CREATE TABLE {s}.spans (
    resource   text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('number', 'time')),
    span       numrange NOT NULL,
    claim_id   bigint NOT NULL,
    expires_at timestamptz,
    CONSTRAINT spans_no_overlap EXCLUDE USING gist (resource WITH =, span WITH &&),
    CONSTRAINT spans_one_kind EXCLUDE USING gist (resource WITH =, kind WITH <>)
);
CREATE INDEX spans_by_claim ON {s}.spans (claim_id);

CREATE TABLE {s}.requests (
    request_id  text PRIMARY KEY,
    fingerprint text NOT NULL,
    claim_id    bigint,                      -- the granted claim, or NULL when lost
    taken       integer[],                   -- indexes of the taken targets when lost
    created_at  timestamptz NOT NULL
);
CREATE INDEX requests_by_age ON {s}.requests (created_at);
