-- Version 6: a group or span claim's first try takes its targets without a
-- subtransaction (claim_v4.sql's header says why and how a loss is undone).
-- No table changes: claim_v4() takes one more argument, p_undo; its old form
-- is dropped, so version-5 code still running gets SchemaError.

DROP FUNCTION IF EXISTS {s}.claim_v4(text, text, double precision, text, text, timestamptz,
    double precision, text[], text[], text[], text[], numeric[], numeric[], text);
