-- sweep_v4: one batch. It only ever locks with SKIP LOCKED, so it never waits
-- on (or deadlocks with) a claim, a confirm or another sweep. No index serves
-- it: the hot path writes none for it, and lazy takeover does not need it.
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
CREATE OR REPLACE FUNCTION {s}.sweep_v4(
    p_now timestamptz, p_retention double precision, p_batch integer,
    OUT expired integer, OUT purged_claims integer, OUT purged_requests integer
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_cutoff timestamptz := v_now - make_interval(secs => p_retention);
    v_last bigint;
    v_ids bigint[];
    v_n integer;
BEGIN
    -- Dead single-unit holds are marked expired in their rows, which stay
    -- (the reason rule: a later claimant still marks them taken over).
    WITH dead AS (
        SELECT u.resource, u.slot FROM {s}.units_v4 u
         WHERE u.state = 'held' AND u.expires_at <= v_now
         LIMIT p_batch FOR UPDATE SKIP LOCKED
    )
    UPDATE {s}.units_v4 u SET state = 'expired', updated_at = v_now
      FROM dead WHERE u.resource = dead.resource AND u.slot = dead.slot
       AND u.state = 'held' AND u.expires_at <= v_now;
    GET DIAGNOSTICS expired = ROW_COUNT;
    WITH dead AS (
        SELECT c.id FROM {s}.claims_v4 c
         WHERE c.state = 'held' AND c.expires_at <= v_now
         ORDER BY c.id LIMIT p_batch FOR UPDATE SKIP LOCKED
    )
    UPDATE {s}.claims_v4 c SET state = 'expired', updated_at = v_now
      FROM dead WHERE c.id = dead.id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    expired := expired + v_n;

    -- Request IDs past the retention: reservation rows go, claim rows drop the
    -- fingerprint (the claim keeps its request_id; the ID may be used anew).
    WITH old AS (
        SELECT x.resource, x.slot FROM {s}.units_v4 x
         WHERE x.fingerprint IS NOT NULL AND x.created_at <= v_cutoff
         LIMIT p_batch FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM {s}.units_v4 u USING old
         WHERE u.resource = old.resource AND u.slot = old.slot AND u.state = 'request'
        RETURNING 1
    ), forgot AS (
        UPDATE {s}.units_v4 u SET fingerprint = NULL FROM old
         WHERE u.resource = old.resource AND u.slot = old.slot AND u.state <> 'request'
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM forgot) INTO purged_requests;

    -- Like every store, keep the newest claim (the highest fence; PostgreSQL
    -- never reuses a fence anyway, so this is only for parity).
    v_last := greatest(
        (SELECT max(u.fence) FROM {s}.units_v4 u
          WHERE u.state IN ('held', 'confirmed', 'released', 'expired')),
        (SELECT max(c.fence) FROM {s}.claims_v4 c));

    WITH ended AS (
        SELECT u.resource, u.slot FROM {s}.units_v4 u
         WHERE u.state IN ('released', 'expired') AND u.updated_at <= v_cutoff
           AND u.fence <> v_last
         LIMIT p_batch FOR UPDATE SKIP LOCKED
    )
    DELETE FROM {s}.units_v4 u USING ended
     WHERE u.resource = ended.resource AND u.slot = ended.slot;
    GET DIAGNOSTICS purged_claims = ROW_COUNT;

    WITH ended AS (
        SELECT c.id FROM {s}.claims_v4 c
         WHERE c.state IN ('released', 'expired') AND c.updated_at <= v_cutoff
           AND c.fence <> v_last
         ORDER BY c.id LIMIT p_batch FOR UPDATE SKIP LOCKED
    ), purged AS (
        DELETE FROM {s}.claims_v4 c USING ended WHERE c.id = ended.id RETURNING c.id
    )
    SELECT coalesce(array_agg(purged.id), '{}') INTO v_ids FROM purged;
    purged_claims := purged_claims + cardinality(v_ids);

    -- Drop the member and span rows of the group claims just purged, and free
    -- rows nobody reused within the retention. (A row locked by a takeover in
    -- flight is skipped: the takeover owns it.)
    DELETE FROM {s}.units_v4 u WHERE u.ctid = ANY(ARRAY(
        SELECT x.ctid FROM {s}.units_v4 x WHERE x.state = 'member' AND x.id = ANY(v_ids)
         ORDER BY x.resource COLLATE "C", x.slot COLLATE "C" FOR UPDATE SKIP LOCKED));
    DELETE FROM {s}.units_v4 u WHERE u.ctid = ANY(ARRAY(
        SELECT x.ctid FROM {s}.units_v4 x WHERE x.state = 'free' AND x.updated_at <= v_cutoff
         LIMIT p_batch FOR UPDATE SKIP LOCKED));
    DELETE FROM {s}.spans_v4 s WHERE s.ctid = ANY(ARRAY(
        SELECT x.ctid FROM {s}.spans_v4 x WHERE x.claim_id = ANY(v_ids)
         ORDER BY x.resource COLLATE "C", lower(x.span) FOR UPDATE SKIP LOCKED));

END
$$;
