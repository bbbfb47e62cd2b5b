-- sweep: one batch. It only ever locks with SKIP LOCKED, so it never waits
-- on (or deadlocks with) a claim, a confirm or another sweep.
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
CREATE OR REPLACE FUNCTION {s}.sweep(
    p_now timestamptz, p_retention double precision, p_batch integer,
    OUT expired integer, OUT purged_claims integer, OUT purged_requests integer
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_cutoff timestamptz := v_now - make_interval(secs => p_retention);
    v_ids bigint[];
BEGIN
    WITH dead AS (
        SELECT c.id FROM {s}.claims c
         WHERE c.state = 'held' AND c.expires_at <= v_now
         ORDER BY c.id LIMIT p_batch FOR UPDATE SKIP LOCKED
    ), marked AS (
        UPDATE {s}.claims c SET state = 'expired', updated_at = v_now
          FROM dead WHERE c.id = dead.id RETURNING c.id
    )
    SELECT coalesce(array_agg(marked.id), '{}') INTO v_ids FROM marked;
    expired := cardinality(v_ids);

    -- Like every store, keep the newest claim (the sequence's last fence;
    -- PostgreSQL never reuses a fence anyway, so this is only for parity).
    WITH ended AS (
        SELECT c.id FROM {s}.claims c
         WHERE c.state IN ('released', 'expired') AND c.updated_at <= v_cutoff
           AND c.fence <> (SELECT f.last_value FROM {s}.fences f)
         ORDER BY c.id LIMIT p_batch FOR UPDATE SKIP LOCKED
    ), purged AS (
        DELETE FROM {s}.claims c USING ended WHERE c.id = ended.id RETURNING c.id
    )
    SELECT coalesce(array_agg(purged.id), '{}'), count(*)
      INTO v_ids, purged_claims FROM purged;

    -- Drop the rows of the claims just purged. An expired hold's rows stay
    -- until then, so that a later claimant taking them over marks it taken
    -- over. (A row locked by a takeover in flight is skipped: the takeover
    -- owns it. One locked by a confirm is left dead, for the next claimant.)
    DELETE FROM {s}.units u WHERE u.ctid = ANY(ARRAY(
        SELECT x.ctid FROM {s}.units x WHERE x.claim_id = ANY(v_ids)
         ORDER BY x.resource COLLATE "C", x.slot COLLATE "C" FOR UPDATE SKIP LOCKED));
    DELETE FROM {s}.spans s WHERE s.ctid = ANY(ARRAY(
        SELECT x.ctid FROM {s}.spans x WHERE x.claim_id = ANY(v_ids)
         ORDER BY x.resource COLLATE "C", lower(x.span) FOR UPDATE SKIP LOCKED));

    WITH old AS (
        SELECT r.request_id FROM {s}.requests r WHERE r.created_at <= v_cutoff
         LIMIT p_batch FOR UPDATE SKIP LOCKED
    )
    DELETE FROM {s}.requests r USING old WHERE r.request_id = old.request_id;
    GET DIAGNOSTICS purged_requests = ROW_COUNT;
END
$$;
