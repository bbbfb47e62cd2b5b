-- Version 3: shared claims, readers beside readers and no writer (see docs/stores.md).
--
-- A shared claim keeps its row in dibs_claims_v2 (mode 'shared'), like a group
-- claim. Its spans are span rows marked shared. Its units are rows of
-- dibs_readers, and the unit's row in dibs_units_v2 is a marker (fence 0,
-- state NULL) for as long as any reader is there, live or dead and not yet
-- taken over: the primary key (resource, slot) stays the arbiter between a
-- writer and the readers, and an exclusive claim that meets the marker looks
-- at the readers. Added columns and a new table only: every existing row keeps
-- its meaning (an exclusive claim), and nothing is copied.

ALTER TABLE dibs_claims_v2 ADD COLUMN mode TEXT;            -- NULL (exclusive) or 'shared'
ALTER TABLE dibs_spans_v2 ADD COLUMN shared INTEGER NOT NULL DEFAULT 0;
CREATE TABLE dibs_readers (
    resource TEXT NOT NULL,
    slot     TEXT NOT NULL,
    fence    INTEGER NOT NULL,                             -- the shared claim's row
    PRIMARY KEY (resource, slot, fence)
) WITHOUT ROWID;
