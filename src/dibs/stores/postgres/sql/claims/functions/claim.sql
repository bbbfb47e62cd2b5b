-- claim: the whole claim in one round trip. Outcomes: granted, replayed (the
-- request ID or the natural key answered with an existing claim), taken,
-- replayed_taken (a recorded loss). Raises DB002 for a request ID reused with
-- other input and DB001 (from check_span_kind) for mixed span kinds.
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
CREATE OR REPLACE FUNCTION {s}.claim(
    p_holder text, p_targets text, p_ttl double precision,
    p_request_id text, p_fingerprint text, p_now timestamptz, p_retention double precision,
    p_ures text[], p_uslot text[],
    p_sres text[], p_skind text[], p_slo numeric[], p_shi numeric[]
) RETURNS TABLE (
    outcome text, taken integer[], id bigint, holder text, targets text, state text,
    fence bigint, expires_at timestamptz, taken_over boolean, request_id text,
    created_at timestamptz, updated_at timestamptz, now timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_req {s}.requests;
    v_id bigint;
    v_expires timestamptz;
    v_taken integer[];
    v_blockers bigint[];
    v_dead bigint[];
    v_claim {s}.claims;
    v_outcome text;
    v_stamp timestamptz;
BEGIN
    IF p_request_id IS NOT NULL THEN
        LOOP
            -- The request row comes first: a retry of the same request waits here
            -- for the first attempt to finish, then replays its outcome.
            INSERT INTO {s}.requests AS r (request_id, fingerprint, created_at)
            VALUES (p_request_id, p_fingerprint, v_now)
            ON CONFLICT DO NOTHING;
            EXIT WHEN FOUND;
            SELECT * INTO v_req FROM {s}.requests r
             WHERE r.request_id = p_request_id FOR UPDATE;
            CONTINUE WHEN NOT FOUND;  -- purged since the insert
            IF v_req.created_at > v_now - make_interval(secs => p_retention) THEN
                IF v_req.fingerprint <> p_fingerprint THEN
                    RAISE EXCEPTION 'request ID reused with different input'
                        USING ERRCODE = 'DB002';
                END IF;
                IF v_req.claim_id IS NULL THEN
                    RETURN QUERY SELECT 'replayed_taken'::text, v_req.taken,
                        NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::bigint,
                        NULL::timestamptz, NULL::boolean, NULL::text, NULL::timestamptz,
                        NULL::timestamptz, v_now;
                    RETURN;
                END IF;
                SELECT * INTO v_claim FROM {s}.claims c WHERE c.id = v_req.claim_id;
                RETURN QUERY SELECT 'replayed'::text, NULL::integer[], v_claim.id,
                    v_claim.holder, v_claim.targets, v_claim.state, v_claim.fence,
                    v_claim.expires_at, v_claim.taken_over, v_claim.request_id,
                    v_claim.created_at, v_claim.updated_at, v_now;
                RETURN;
            END IF;
            -- Past retention the ID is free again: this is a new request.
            UPDATE {s}.requests r SET fingerprint = p_fingerprint, claim_id = NULL,
                   taken = NULL, created_at = v_now
             WHERE r.request_id = p_request_id;
            EXIT;
        END LOOP;
    END IF;

    v_id := nextval('{s}.claim_ids');
    v_expires := CASE WHEN p_ttl IS NULL THEN NULL
                      ELSE v_now + make_interval(secs => p_ttl) END;
    IF coalesce(array_length(p_ures, 1), 0) = 1 AND p_sres IS NULL THEN
        -- One unit: a loss wrote nothing, so no subtransaction is needed.
        SELECT * INTO v_taken, v_blockers, v_dead FROM {s}.take_all(
            v_id, v_expires, v_now, p_ures, p_uslot, p_sres, p_skind, p_slo, p_shi);
    ELSE
        BEGIN
            SELECT * INTO v_taken, v_blockers, v_dead FROM {s}.take_all(
                v_id, v_expires, v_now, p_ures, p_uslot, p_sres, p_skind, p_slo, p_shi);
            IF cardinality(v_taken) > 0 THEN
                RAISE EXCEPTION 'lost' USING ERRCODE = 'DB010';
            END IF;
        EXCEPTION WHEN SQLSTATE 'DB010' THEN
            NULL;  -- all or nothing: undo the targets this attempt took
        END;
    END IF;

    IF cardinality(v_taken) = 0 THEN
        -- v_now was read before take_all, which may have waited on row locks
        -- (behind a release of these targets, say). Judging with the earlier
        -- time is only ever more cautious, but the claim is dated, and its
        -- hold's TTL counted, from after every wait: it never seems to begin
        -- before what it waited for ended, and expires_at = created_at + ttl.
        v_stamp := coalesce(p_now, clock_timestamp());
        IF p_ttl IS NOT NULL AND v_stamp <> v_now THEN
            v_expires := v_stamp + make_interval(secs => p_ttl);
            UPDATE {s}.units u SET expires_at = v_expires WHERE u.claim_id = v_id;
            UPDATE {s}.spans s SET expires_at = v_expires WHERE s.claim_id = v_id;
        END IF;
        -- The fence is drawn only now, with every target held, so it exceeds
        -- the fence of every earlier claim on them.
        INSERT INTO {s}.claims (id, holder, targets, state, fence, expires_at, request_id,
                                created_at, updated_at)
        VALUES (v_id, p_holder, p_targets,
                CASE WHEN p_ttl IS NULL THEN 'confirmed' ELSE 'held' END,
                nextval('{s}.fences'), v_expires, p_request_id, v_stamp, v_stamp)
        RETURNING * INTO v_claim;
        v_outcome := 'granted';
    ELSE
        v_outcome := 'taken';
        IF (SELECT count(DISTINCT b) FROM unnest(v_blockers) b) = 1 THEN
            -- Natural key: the holder re-claiming exactly what it holds.
            SELECT * INTO v_claim FROM {s}.claims c
             WHERE c.id = v_blockers[1] AND c.holder = p_holder
               AND c.targets::jsonb = p_targets::jsonb;
            IF FOUND THEN
                v_outcome := 'replayed';
                v_taken := NULL;
            END IF;
        END IF;
    END IF;

    IF p_request_id IS NOT NULL THEN
        UPDATE {s}.requests r SET claim_id = v_claim.id,
               taken = CASE WHEN v_outcome = 'taken' THEN v_taken END
         WHERE r.request_id = p_request_id;
    END IF;
    RETURN QUERY SELECT v_outcome, v_taken, v_claim.id, v_claim.holder, v_claim.targets,
        v_claim.state, v_claim.fence, v_claim.expires_at, v_claim.taken_over,
        v_claim.request_id, v_claim.created_at, v_claim.updated_at, v_now;
END
$$;
