-- claim_v4: the whole claim in one round trip, for what the plain statement
-- (dibs.stores.postgres._sql.Statements.claim_unit) does not settle: a
-- contended unit, a group or span claim, a request ID seen before. Outcomes:
-- granted, replayed (the request ID or the natural key answered with an
-- existing claim), taken, replayed_taken (a recorded loss). Raises DB002 for a
-- request ID reused with other input and DB001 (from check_span_kind_v4) for
-- mixed span kinds. p_mode 'shared' makes a reader's claim (take_all_v4 takes
-- its targets as a reader; never a natural-key replay); the result's mode
-- column says the claim's mode.
--
-- p_undo: a group or span claim's first try passes false and takes its targets
-- without a subtransaction (schema version 6). A PL/pgSQL block with an
-- EXCEPTION clause starts one on entry, won or lost: a second transaction ID
-- on every granted group claim, in pg_subtrans and the commit record (every
-- @dibs.idempotent result is such a claim). A try that loses after it took
-- some targets cannot undo them by hand (a takeover replaced a dead claim's
-- row and archived it), so it raises DB010 and the whole statement rolls back,
-- its request reservation with it: nothing was decided or answered yet. The
-- caller then asks again with p_undo true, the path below with the
-- subtransaction, which decides, records a loss under the request ID and
-- answers. A loss at the first of its units wrote nothing, so it is decided
-- and recorded on the first try (the usual loss in a race for the same
-- targets, and a natural-key replay), as is every win.
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
CREATE OR REPLACE FUNCTION {s}.claim_v4(
    p_holder text, p_targets text, p_ttl double precision,
    p_request_id text, p_fingerprint text, p_now timestamptz, p_retention double precision,
    p_ures text[], p_uslot text[],
    p_sres text[], p_skind text[], p_slo numeric[], p_shi numeric[], p_mode text,
    p_undo boolean
) RETURNS TABLE (
    outcome text, taken integer[], id bigint, holder text, targets text, state text,
    fence bigint, expires_at timestamptz, taken_over boolean, request_id text,
    created_at timestamptz, updated_at timestamptz, mode text, now timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_u {s}.units_v4;
    v_id bigint;
    v_expires timestamptz;
    v_taken integer[];
    v_blockers bigint[];
    v_dead bigint[];
    v_claim {s}.claims_v4;
    v_got record;
    v_outcome text;
    v_stamp timestamptz;
    v_shared boolean := p_mode = 'shared';
    v_single boolean := coalesce(array_length(p_ures, 1), 0) = 1 AND p_sres IS NULL
                        AND p_mode = 'exclusive';
BEGIN
    IF p_request_id IS NOT NULL THEN
        LOOP
            -- The reservation first: units_v4's unique index on request_id is the
            -- one arbiter of request IDs, so a retry of a request in flight waits
            -- here for the first attempt to finish, then replays its outcome.
            INSERT INTO {s}.units_v4 AS r (resource, slot, id, state, fence, request_id,
                                           fingerprint, created_at, updated_at)
            VALUES ('', p_request_id, 0, 'request', 0, p_request_id, p_fingerprint, v_now,
                    v_now)
            ON CONFLICT DO NOTHING;
            EXIT WHEN FOUND;
            -- A plain read (no row lock, no WAL): what is recorded never changes.
            SELECT * INTO v_u FROM {s}.units_v4 u
             WHERE u.request_id = p_request_id AND u.fingerprint IS NOT NULL;
            CONTINUE WHEN NOT FOUND;  -- purged since the insert
            IF v_u.created_at > v_now - make_interval(secs => p_retention) THEN
                IF v_u.fingerprint <> p_fingerprint THEN
                    RAISE EXCEPTION 'request ID reused with different input'
                        USING ERRCODE = 'DB002';
                END IF;
                IF v_u.state = 'request' AND v_u.id = 0 THEN
                    RETURN QUERY SELECT 'replayed_taken'::text, v_u.taken,
                        NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::bigint,
                        NULL::timestamptz, NULL::boolean, NULL::text, NULL::timestamptz,
                        NULL::timestamptz, NULL::text, v_now;
                    RETURN;
                END IF;
                RETURN QUERY SELECT 'replayed'::text, NULL::integer[], c.*, v_now
                    FROM (SELECT 1) one
                    LEFT JOIN {s}.claim_by_id_v4(v_u.id) c ON true;
                RETURN;
            END IF;
            -- Past retention the ID is free again: take it back, then reserve it.
            IF v_u.state = 'request' THEN
                DELETE FROM {s}.units_v4 u WHERE u.resource = '' AND u.slot = p_request_id
                   AND u.created_at = v_u.created_at;
            ELSE
                UPDATE {s}.units_v4 u SET fingerprint = NULL
                 WHERE u.resource = v_u.resource AND u.slot = v_u.slot
                   AND u.request_id = p_request_id AND u.fingerprint IS NOT NULL;
            END IF;
        END LOOP;
    END IF;

    v_id := nextval('{s}.claim_ids');
    IF v_single THEN
        -- One unit: its row is the claim, dated by take_unit_v4 after it looked
        -- at the row. A loss wrote nothing, so no subtransaction is needed.
        SELECT * INTO v_got FROM {s}.take_unit_v4(
            ROW(p_ures[1], p_uslot[1], v_id, p_holder,
                CASE WHEN p_ttl IS NULL THEN 'confirmed' ELSE 'held' END, 0, NULL, false,
                NULL, NULL, NULL, v_now, v_now)::{s}.units_v4, v_now, p_now, p_ttl);
        IF v_got.outcome = 'granted' THEN
            IF v_got.other IS NOT NULL THEN
                PERFORM {s}.take_over_v4(ARRAY[v_got.other], v_now);
            END IF;
            IF p_request_id IS NOT NULL THEN
                -- The request ID moves from its reservation onto the claim's row.
                DELETE FROM {s}.units_v4 u WHERE u.resource = '' AND u.slot = p_request_id;
                UPDATE {s}.units_v4 u SET request_id = p_request_id, fingerprint = p_fingerprint
                 WHERE u.resource = p_ures[1] AND u.slot = p_uslot[1];
            END IF;
            RETURN QUERY SELECT 'granted'::text, NULL::integer[], c.*, v_now
                FROM {s}.claim_by_id_v4(v_id) c;
            RETURN;
        END IF;
        v_taken := ARRAY[0];
        v_blockers := ARRAY[v_got.other];
    ELSE
        v_expires := CASE WHEN p_ttl IS NULL THEN NULL
                          ELSE v_now + make_interval(secs => p_ttl) END;
        LOOP
            IF NOT p_undo THEN
                -- The first try: no subtransaction (see the header).
                SELECT * INTO v_taken, v_blockers, v_dead FROM {s}.take_all_v4(
                    v_id, v_expires, v_now, p_ures, p_uslot, p_sres, p_skind, p_slo, p_shi,
                    v_shared);
                -- Lost, and not at the first unit (only there does a loss
                -- write nothing; {-1} says nothing of where; a reader's try
                -- locks the row it lost at): roll it all back and ask again.
                IF cardinality(v_taken) > 0 AND NOT (0 = ANY(v_taken) AND NOT v_shared
                        AND coalesce(array_length(p_ures, 1), 0) > 0) THEN
                    RAISE EXCEPTION 'a group claim lost after taking targets'
                        USING ERRCODE = 'DB010';
                END IF;
            ELSE
                BEGIN
                    SELECT * INTO v_taken, v_blockers, v_dead FROM {s}.take_all_v4(
                        v_id, v_expires, v_now, p_ures, p_uslot, p_sres, p_skind, p_slo,
                        p_shi, v_shared);
                    IF cardinality(v_taken) > 0 THEN
                        RAISE EXCEPTION 'lost' USING ERRCODE = 'DB010';
                    END IF;
                EXCEPTION WHEN SQLSTATE 'DB010' THEN
                    NULL;  -- all or nothing: undo the targets this attempt took
                END;
            END IF;
            -- {-1}: what blocked it was gone when it looked again; try again.
            EXIT WHEN v_taken IS DISTINCT FROM ARRAY[-1];
            v_now := coalesce(p_now, clock_timestamp());
        END LOOP;
    END IF;

    IF cardinality(v_taken) = 0 THEN
        -- v_now was read before take_all_v4, which may have waited on row locks
        -- (behind a release of these targets, say). The claim is dated, and its
        -- hold's TTL counted, from after every wait.
        v_stamp := coalesce(p_now, clock_timestamp());
        IF p_ttl IS NOT NULL AND v_stamp <> v_now THEN
            v_expires := v_stamp + make_interval(secs => p_ttl);
            UPDATE {s}.units_v4 u SET expires_at = v_expires
             WHERE u.id = v_id AND u.state = 'member';
            UPDATE {s}.spans_v4 s SET expires_at = v_expires WHERE s.claim_id = v_id;
        END IF;
        -- The fence is drawn only now, with every target held, so it exceeds
        -- the fence of every earlier claim on them.
        INSERT INTO {s}.claims_v4 (id, holder, targets, state, fence, expires_at, request_id,
                                   created_at, updated_at, mode)
        VALUES (v_id, p_holder, p_targets,
                CASE WHEN p_ttl IS NULL THEN 'confirmed' ELSE 'held' END,
                nextval('{s}.fences'), v_expires, p_request_id, v_stamp, v_stamp,
                CASE WHEN v_shared THEN 'shared' END);
        IF v_shared THEN
            -- The markers' expiry now counts this reader's (its row exists).
            PERFORM {s}.refresh_marker_v5(t.res, t.slot, v_stamp)
               FROM unnest(p_ures, p_uslot) AS t(res, slot);
        END IF;
        v_outcome := 'granted';
        SELECT * INTO v_claim FROM {s}.claim_by_id_v4(v_id);
    ELSE
        v_outcome := 'taken';
        IF NOT v_shared AND (SELECT count(DISTINCT b) FROM unnest(v_blockers) b) = 1 THEN
            -- Natural key: the holder re-claiming exactly what it holds
            -- exclusively (a shared re-claim is another reader: never a replay).
            SELECT * INTO v_claim FROM {s}.claim_by_id_v4(v_blockers[1]) c
             WHERE c.holder = p_holder AND c.targets::jsonb = p_targets::jsonb
               AND c.mode = 'exclusive';
            IF FOUND THEN
                v_outcome := 'replayed';
                v_taken := NULL;
            END IF;
        END IF;
    END IF;

    IF p_request_id IS NOT NULL THEN
        UPDATE {s}.units_v4 r SET id = coalesce(v_claim.id, 0),
               taken = CASE WHEN v_outcome = 'taken' THEN v_taken END
         WHERE r.resource = '' AND r.slot = p_request_id;
    END IF;
    RETURN QUERY SELECT v_outcome, v_taken, v_claim.id, v_claim.holder, v_claim.targets,
        v_claim.state, v_claim.fence, v_claim.expires_at, v_claim.taken_over,
        v_claim.request_id, v_claim.created_at, v_claim.updated_at,
        coalesce(v_claim.mode, 'exclusive'), v_now;
END
$$;
