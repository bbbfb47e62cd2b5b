-- Version 4: the arbiter row is the claim (issue 15).
--
-- A single-unit claim (the common case) now lives in its unit row, units_v4:
-- holder, state, fence, expiry and request ID under the one key (resource,
-- slot), so a new claim is one insert or one conditional update of that row,
-- and confirm, extend and release are one plain UPDATE each. The row keeps the
-- latest claim on its unit in every state (a release leaves it as the fence
-- high-water mark); the claim it replaces is copied into claims_v4 in the
-- same statement. Group and span claims keep their row in claims_v4, with one
-- 'member' unit row per unit. Every request ID lives in units_v4's one unique
-- index: on the claim's own unit row, or in a reservation row (resource '',
-- which no claim can name; slot = the request ID) for refusals, group claims
-- and replaced unit claims. IDs and fences keep their sequences: a fence is
-- drawn only for a claim about to be granted.
--
-- Every table is renamed, and the version-3 functions are replaced by stubs
-- that raise DB009, so a process still running version-3 code fails loudly
-- instead of writing rows whose meaning changed.

ALTER TABLE {s}.claims RENAME TO claims_v4;
ALTER TABLE {s}.spans RENAME TO spans_v4;
ALTER TABLE {s}.units RENAME TO units_v3;
ALTER TABLE {s}.requests RENAME TO requests_v3;

CREATE TABLE {s}.units_v4 (
    resource    text NOT NULL,
    slot        text NOT NULL,
    id          bigint NOT NULL,
    holder      text,
    state       text NOT NULL CHECK (state IN
                    ('held', 'confirmed', 'released', 'expired', 'member', 'free', 'request')),
    fence       bigint NOT NULL,
    expires_at  timestamptz,
    taken_over  boolean NOT NULL DEFAULT false,
    request_id  text,
    fingerprint text,
    taken       integer[],
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (resource, slot),
    CHECK (state <> 'held' OR expires_at IS NOT NULL),
    CHECK (state <> 'confirmed' OR expires_at IS NULL),
    CHECK ((state IN ('member', 'free', 'request')) = (holder IS NULL))
) WITH (fillfactor = 85);
-- Without deduplication: IDs are unique in practice and one holder's claims
-- are appended in heap order, so merging duplicates would be wasted work on
-- every page that fills.
CREATE INDEX units_v4_by_id ON {s}.units_v4 (id) WITH (deduplicate_items = off);
CREATE INDEX units_v4_by_holder ON {s}.units_v4 (holder) WITH (deduplicate_items = off)
    WHERE holder IS NOT NULL;
-- A request ID is live (replayable) while its fingerprint is kept; past the
-- retention sweep() drops the fingerprint and the claim keeps its request_id.
CREATE UNIQUE INDEX units_v4_by_request ON {s}.units_v4 (request_id)
    WHERE fingerprint IS NOT NULL;

-- Single-unit claims still on their unit (live, or dead and not yet taken over
-- or purged) move into their unit row, with their request ID if they have one.
INSERT INTO {s}.units_v4 (resource, slot, id, holder, state, fence, expires_at, taken_over,
                          request_id, fingerprint, created_at, updated_at)
SELECT u.resource, u.slot, c.id, c.holder, c.state, c.fence, c.expires_at, c.taken_over,
       c.request_id, r.fingerprint, c.created_at, c.updated_at
  FROM {s}.units_v3 u
  JOIN {s}.claims_v4 c ON c.id = u.claim_id
  LEFT JOIN {s}.requests_v3 r ON r.claim_id = c.id AND r.request_id = c.request_id
 WHERE jsonb_array_length(c.targets::jsonb) = 1;
DELETE FROM {s}.claims_v4 c USING {s}.units_v4 u WHERE u.id = c.id;
-- The units of group claims become member rows.
INSERT INTO {s}.units_v4 (resource, slot, id, state, fence, expires_at, created_at, updated_at)
SELECT u.resource, u.slot, u.claim_id, 'member', 0, u.expires_at, c.created_at, c.updated_at
  FROM {s}.units_v3 u JOIN {s}.claims_v4 c ON c.id = u.claim_id;
-- Every other request record becomes a reservation row.
INSERT INTO {s}.units_v4 (resource, slot, id, state, fence, request_id, fingerprint, taken,
                          created_at, updated_at)
SELECT '', r.request_id, coalesce(r.claim_id, 0), 'request', 0, r.request_id, r.fingerprint,
       r.taken, r.created_at, r.created_at
  FROM {s}.requests_v3 r
 WHERE NOT EXISTS (SELECT 1 FROM {s}.units_v4 u
                    WHERE u.request_id = r.request_id AND u.fingerprint IS NOT NULL);

DROP FUNCTION IF EXISTS {s}.claim(text, text, double precision, text, text, timestamptz,
    double precision, text[], text[], text[], text[], numeric[], numeric[]);
DROP FUNCTION IF EXISTS {s}.take_all(bigint, timestamptz, timestamptz, text[], text[], text[],
    text[], numeric[], numeric[]);
DROP FUNCTION IF EXISTS {s}.transition(text, bigint, text, bigint, double precision, timestamptz);
DROP FUNCTION IF EXISTS {s}.sweep(timestamptz, double precision, integer);
DROP FUNCTION IF EXISTS {s}.check_span_kind(text, text, timestamptz, integer);
DROP TABLE {s}.units_v3;
DROP TABLE {s}.requests_v3;
