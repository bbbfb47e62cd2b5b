-- Version 2: a single-unit claim lives in its unit row (see docs/stores.md).
--
-- Every table gets a new name: a dibs that still runs version 1 code on this
-- file then fails on its next statement ("no such table") instead of reading
-- or writing tables whose meaning changed, and on reopening it meets the
-- version check (SchemaError). The next schema change that alters meaning
-- renames again.

CREATE TABLE dibs_units_v2 (
    resource    TEXT NOT NULL,
    slot        TEXT NOT NULL,
    -- The unit's claim: its fence and ID. A single-unit claim is this row
    -- (state set), a unit of a group or span claim has state NULL and points
    -- at its row in dibs_claims_v2.
    fence       INTEGER NOT NULL,
    state       TEXT,
    holder      TEXT,
    expires_at  INTEGER,                           -- µs since the epoch, store clock
    request_id  TEXT,
    fingerprint TEXT,                              -- set while the request replays from here
    created_at  INTEGER,
    updated_at  INTEGER,
    PRIMARY KEY (resource, slot)
) WITHOUT ROWID;

CREATE TABLE dibs_claims_v2 (
    -- Group and span claims, and single-unit claims a later claim replaced on
    -- their unit (kept for get(), the reason rule and the log until purged).
    fence      INTEGER PRIMARY KEY,
    holder     TEXT NOT NULL,
    targets    TEXT NOT NULL,                      -- canonical JSON
    state      TEXT NOT NULL,
    expires_at INTEGER,
    taken_over INTEGER NOT NULL DEFAULT 0,
    request_id TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

-- Units of live claims, and of dead ones not yet taken over, with their claim
-- moved into the unit row when it is a single-unit claim.
INSERT INTO dibs_units_v2
    (resource, slot, fence, state, holder, expires_at, request_id, fingerprint,
     created_at, updated_at)
SELECT u.resource, u.slot, u.fence, c.state, c.holder, c.expires_at, c.request_id, NULL,
       c.created_at, c.updated_at
FROM dibs_units u JOIN dibs_claims c ON c.fence = u.fence
WHERE json_array_length(c.targets) = 1 AND c.taken_over = 0;

INSERT INTO dibs_units_v2 (resource, slot, fence)
SELECT u.resource, u.slot, u.fence FROM dibs_units u
WHERE NOT EXISTS (
    SELECT 1 FROM dibs_units_v2 v WHERE v.resource = u.resource AND v.slot = u.slot
);

-- Get by claim ID, confirm, extend and release, and the next fence, which is
-- max(fence) over both tables + 1 (sweep never purges the highest fence).
-- Built before the next statement, whose NOT EXISTS looks units up by fence:
-- without it each claim scans every unit row, and the upgrade is quadratic.
CREATE INDEX dibs_units_v2_by_fence ON dibs_units_v2 (fence);

INSERT INTO dibs_claims_v2
    (fence, holder, targets, state, expires_at, taken_over, request_id, created_at, updated_at)
SELECT c.fence, c.holder, c.targets, c.state, c.expires_at, c.taken_over, c.request_id,
       c.created_at, c.updated_at
FROM dibs_claims c
WHERE NOT EXISTS (
    SELECT 1 FROM dibs_units_v2 v WHERE v.fence = c.fence AND v.state IS NOT NULL
);

CREATE TABLE dibs_spans_v2 (
    resource TEXT NOT NULL,
    lo       NOT NULL,                             -- numbers, or µs for datetimes
    hi       NOT NULL,
    kind     TEXT NOT NULL,
    fence    INTEGER NOT NULL
);
INSERT INTO dibs_spans_v2 (resource, lo, hi, kind, fence)
SELECT resource, lo, hi, kind, fence FROM dibs_spans;

-- Lost outcomes, group and span claims, and single-unit claims that moved to
-- dibs_claims_v2. A granted single-unit request replays from its unit row.
-- The records of version 1 stay here, and find their claim by fence.
CREATE TABLE dibs_requests_v2 (
    request_id  TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    fence       INTEGER,                           -- the granted claim, or NULL
    taken       TEXT,                              -- JSON targets when lost
    created_at  INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO dibs_requests_v2 (request_id, fingerprint, fence, taken, created_at)
SELECT request_id, fingerprint, fence, taken, created_at FROM dibs_requests;

DROP TABLE dibs_units;
DROP TABLE dibs_claims;
DROP TABLE dibs_spans;
DROP TABLE dibs_requests;

-- claims_of(). Every single-unit claim in its row, whatever its state, so that
-- confirm and release (which change only the state) leave this index alone.
CREATE INDEX dibs_units_v2_by_holder ON dibs_units_v2 (holder) WHERE holder IS NOT NULL;
-- Replays of granted single-unit requests within retention.
CREATE INDEX dibs_units_v2_by_request
    ON dibs_units_v2 (request_id) WHERE fingerprint IS NOT NULL;
-- Written only by group and span claims and when a unit changes claim.
CREATE INDEX dibs_claims_v2_by_holder
    ON dibs_claims_v2 (holder) WHERE state IN ('held', 'confirmed');
CREATE INDEX dibs_claims_v2_held
    ON dibs_claims_v2 (expires_at) WHERE state = 'held';
CREATE INDEX dibs_claims_v2_ended
    ON dibs_claims_v2 (updated_at) WHERE state IN ('released', 'expired');
CREATE INDEX dibs_spans_v2_by_resource ON dibs_spans_v2 (resource, lo);
CREATE INDEX dibs_requests_v2_by_age ON dibs_requests_v2 (created_at);
