-- Version 5: shared claims, readers beside readers and no writer (issue 26
-- item 8; see docs/stores.md).
--
-- A shared claim keeps its row in claims_v4 (mode 'shared'), like a group
-- claim. Its spans are span rows whose readers range is [id, id + 1): the
-- no-overlap constraint now also needs the readers ranges to overlap, so
-- readers never exclude each other while a writer's span (readers unbounded,
-- every existing row) overlaps every one. Its units are rows of readers_v5,
-- and the unit's row in units_v4 is a marker ('member', id 0, fence 0) whose
-- expiry is the latest of its readers' (NULL while one is confirmed), for as
-- long as any reader is there, live or dead and not yet taken over: every
-- exclusive path sees the marker as a live claim in the way while a reader
-- lives, and takes it over (marking the readers taken over) once none does.
-- Added columns, a new table and a wider constraint: every existing row keeps
-- its meaning (an exclusive claim), and nothing is copied.

ALTER TABLE {s}.claims_v4 ADD COLUMN mode text CHECK (mode IS NULL OR mode = 'shared');
ALTER TABLE {s}.spans_v4 ADD COLUMN readers int8range NOT NULL DEFAULT '(,)';
ALTER TABLE {s}.spans_v4 DROP CONSTRAINT spans_no_overlap;
ALTER TABLE {s}.spans_v4 ADD CONSTRAINT spans_no_overlap
    EXCLUDE USING gist (resource WITH =, span WITH &&, readers WITH &&);
CREATE TABLE {s}.readers_v5 (
    resource text NOT NULL,
    slot     text NOT NULL,
    claim_id bigint NOT NULL,
    PRIMARY KEY (resource, slot, claim_id)
);
CREATE INDEX readers_v5_by_claim ON {s}.readers_v5 (claim_id);

-- Functions whose arguments or result columns changed (recreated after this step).
DROP FUNCTION IF EXISTS {s}.claim_v4(text, text, double precision, text, text, timestamptz,
    double precision, text[], text[], text[], text[], numeric[], numeric[]);
DROP FUNCTION IF EXISTS {s}.take_all_v4(bigint, timestamptz, timestamptz, text[], text[],
    text[], text[], numeric[], numeric[]);
DROP FUNCTION IF EXISTS {s}.transition_v4(text, bigint, text, bigint, double precision,
    timestamptz);
DROP FUNCTION IF EXISTS {s}.claim_by_id_v4(bigint);
