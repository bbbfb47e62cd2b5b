-- The PostgreSQL claim schema as dibs schema version 2 made it (frozen; {s}: the schema).

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


CREATE FUNCTION {s}.take_all(
    p_id bigint, p_expires timestamptz, p_now timestamptz,
    p_ures text[], p_uslot text[],
    p_sres text[], p_skind text[], p_slo numeric[], p_shi numeric[],
    OUT taken integer[], OUT blockers bigint[], OUT dead bigint[]
) LANGUAGE plpgsql AS $$
DECLARE
    v_nu integer := coalesce(array_length(p_ures, 1), 0);
    v_ns integer := coalesce(array_length(p_sres, 1), 0);
    v_lost boolean := false;
    v_other bigint;
    v_exp timestamptz;
    v_rng numrange;
    v_ids bigint[];
BEGIN
    taken := '{}'; blockers := '{}'; dead := '{}';
    FOR i IN 1 .. v_nu LOOP
        IF v_lost THEN
            SELECT u.claim_id INTO v_other FROM {s}.units u
             WHERE u.resource = p_ures[i] AND u.slot = p_uslot[i]
               AND (u.expires_at IS NULL OR u.expires_at > p_now);
            IF FOUND THEN
                taken := taken || (i - 1); blockers := blockers || v_other;
            END IF;
            CONTINUE;
        END IF;
        LOOP
            -- Linearization point for a free unit: the insert against the primary key.
            INSERT INTO {s}.units (resource, slot, claim_id, expires_at)
            VALUES (p_ures[i], p_uslot[i], p_id, p_expires)
            ON CONFLICT DO NOTHING;
            EXIT WHEN FOUND;
            SELECT u.claim_id, u.expires_at INTO v_other, v_exp FROM {s}.units u
             WHERE u.resource = p_ures[i] AND u.slot = p_uslot[i] FOR UPDATE;
            CONTINUE WHEN NOT FOUND;  -- released since the insert: insert again
            IF v_exp IS NOT NULL AND v_exp <= p_now THEN
                -- Lazy takeover: a conditional write on the dead hold observed
                -- (and row-locked) above; a confirm racing it waits on that lock.
                UPDATE {s}.units u SET claim_id = p_id, expires_at = p_expires
                 WHERE u.resource = p_ures[i] AND u.slot = p_uslot[i] AND u.claim_id = v_other;
                dead := dead || v_other;
            ELSE
                taken := taken || (i - 1); blockers := blockers || v_other; v_lost := true;
            END IF;
            EXIT;
        END LOOP;
    END LOOP;
    FOR j IN 1 .. v_ns LOOP
        v_rng := numrange(p_slo[j], p_shi[j], '[)');
        IF NOT v_lost THEN
            LOOP
                -- Clear dead spans in the way: overlapping ones (taken over) and
                -- any of the other kind (they would trip spans_one_kind).
                WITH gone AS (
                    DELETE FROM {s}.spans s
                     WHERE s.resource = p_sres[j] AND (s.span && v_rng OR s.kind <> p_skind[j])
                       AND s.expires_at <= p_now
                    RETURNING s.claim_id, s.kind
                )
                SELECT coalesce(array_agg(g.claim_id) FILTER (WHERE g.kind = p_skind[j]), '{}')
                  INTO v_ids FROM gone g;
                dead := dead || v_ids;
                -- Linearization point for a span: the insert against both exclusion
                -- constraints (it waits for any uncommitted overlapping insert).
                INSERT INTO {s}.spans (resource, kind, span, claim_id, expires_at)
                VALUES (p_sres[j], p_skind[j], v_rng, p_id, p_expires)
                ON CONFLICT DO NOTHING;
                EXIT WHEN FOUND;
                PERFORM {s}.check_span_kind(p_sres[j], p_skind[j], p_now, v_nu + j - 1);
                SELECT array_agg(s.claim_id) INTO v_ids FROM {s}.spans s
                 WHERE s.resource = p_sres[j] AND s.kind = p_skind[j] AND s.span && v_rng
                   AND (s.expires_at IS NULL OR s.expires_at > p_now);
                IF v_ids IS NOT NULL THEN
                    taken := taken || (v_nu + j - 1); blockers := blockers || v_ids;
                    v_lost := true;
                    EXIT;
                END IF;
                -- The blocker ended or died after our insert saw it: try again.
            END LOOP;
        ELSE
            PERFORM {s}.check_span_kind(p_sres[j], p_skind[j], p_now, v_nu + j - 1);
            SELECT array_agg(s.claim_id) INTO v_ids FROM {s}.spans s
             WHERE s.resource = p_sres[j] AND s.kind = p_skind[j] AND s.span && v_rng
               AND (s.expires_at IS NULL OR s.expires_at > p_now);
            IF v_ids IS NOT NULL THEN
                taken := taken || (v_nu + j - 1); blockers := blockers || v_ids;
            END IF;
        END IF;
    END LOOP;
    IF NOT v_lost AND cardinality(dead) > 0 THEN
        -- Claim rows last, in id order (the module's lock order).
        UPDATE {s}.claims c SET state = 'expired', taken_over = true, updated_at = p_now
         WHERE c.id IN (SELECT DISTINCT d FROM unnest(dead) d ORDER BY d) AND c.state = 'held';
    END IF;
END
$$;

CREATE FUNCTION {s}.check_span_kind(
    p_resource text, p_kind text, p_now timestamptz, p_index integer
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_kind text;
BEGIN
    SELECT s.kind INTO v_kind FROM {s}.spans s
     WHERE s.resource = p_resource AND s.kind <> p_kind
       AND (s.expires_at IS NULL OR s.expires_at > p_now)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'resource % holds % spans', p_resource, v_kind
            USING ERRCODE = 'DB001', DETAIL = p_index::text || ' ' || v_kind;
    END IF;
END
$$;


CREATE FUNCTION {s}.claim(
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


CREATE FUNCTION {s}.transition(
    p_op text, p_id bigint, p_holder text, p_fence bigint, p_ttl double precision,
    p_now timestamptz
) RETURNS TABLE (
    status text, id bigint, holder text, targets text, state text, fence bigint,
    expires_at timestamptz, taken_over boolean, request_id text,
    created_at timestamptz, updated_at timestamptz, now timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    v_claim {s}.claims;
    v_now timestamptz;
    v_status text := 'ok';
    v_expires timestamptz;
BEGIN
    -- The claim's unit rows, its span rows, then its claim row: the lock order
    -- a claimant taking over these targets follows too.
    PERFORM 1 FROM {s}.units u WHERE u.claim_id = p_id ORDER BY u.resource, u.slot FOR UPDATE;
    PERFORM 1 FROM {s}.spans s WHERE s.claim_id = p_id
      ORDER BY s.resource, lower(s.span) FOR UPDATE;
    SELECT * INTO v_claim FROM {s}.claims c WHERE c.id = p_id FOR UPDATE;
    -- Read the clock only with every lock held, so a takeover that won the
    -- race is seen and a hold is never judged live on a stale clock.
    v_now := coalesce(p_now, clock_timestamp());
    IF NOT FOUND THEN
        v_status := 'not_found';
    ELSIF v_claim.holder <> p_holder THEN
        v_status := 'not_holder';
    ELSIF v_claim.fence <> p_fence THEN
        v_status := 'fence';
    ELSIF v_claim.state = 'released' THEN
        v_status := 'released';
    ELSIF v_claim.state = 'expired' OR (v_claim.state = 'held' AND v_claim.expires_at <= v_now)
    THEN
        v_status := CASE WHEN v_claim.taken_over THEN 'taken_over' ELSE 'expired' END;
    ELSIF p_op = 'release' THEN
        -- Linearization point (release, confirm, extend): the conditional
        -- write below, under the locks taken above (so its conditions, checked
        -- once more in its WHERE, cannot have changed since they were read).
        UPDATE {s}.claims c SET state = 'released', expires_at = NULL, updated_at = v_now
         WHERE c.id = p_id AND c.holder = p_holder AND c.fence = p_fence
           AND (c.state = 'confirmed' OR (c.state = 'held' AND c.expires_at > v_now))
        RETURNING * INTO v_claim;
        DELETE FROM {s}.units u WHERE u.claim_id = p_id;
        DELETE FROM {s}.spans s WHERE s.claim_id = p_id;
    ELSIF v_claim.state = 'held' THEN
        v_expires := CASE WHEN p_op = 'extend' THEN v_now + make_interval(secs => p_ttl) END;
        UPDATE {s}.claims c
           SET state = CASE WHEN p_op = 'confirm' THEN 'confirmed' ELSE 'held' END,
               expires_at = v_expires, updated_at = v_now
         WHERE c.id = p_id AND c.holder = p_holder AND c.fence = p_fence
           AND c.state = 'held' AND c.expires_at > v_now
        RETURNING * INTO v_claim;
        UPDATE {s}.units u SET expires_at = v_expires WHERE u.claim_id = p_id;
        UPDATE {s}.spans s SET expires_at = v_expires WHERE s.claim_id = p_id;
    END IF;
    RETURN QUERY SELECT v_status, v_claim.id, v_claim.holder, v_claim.targets,
        v_claim.state, v_claim.fence, v_claim.expires_at, v_claim.taken_over,
        v_claim.request_id, v_claim.created_at, v_claim.updated_at, v_now;
END
$$;


CREATE FUNCTION {s}.sweep(
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
    SELECT v_ids || coalesce(array_agg(purged.id), '{}'), count(*)
      INTO v_ids, purged_claims FROM purged;

    -- Free the targets of the holds just marked expired or purged (rows of a
    -- confirm or takeover in flight are skipped: they are dealt with there).
    DELETE FROM {s}.units u WHERE u.ctid = ANY(ARRAY(
        SELECT x.ctid FROM {s}.units x
         WHERE x.claim_id = ANY(v_ids) AND x.expires_at <= v_now
         ORDER BY x.resource, x.slot FOR UPDATE SKIP LOCKED));
    DELETE FROM {s}.spans s WHERE s.ctid = ANY(ARRAY(
        SELECT x.ctid FROM {s}.spans x
         WHERE x.claim_id = ANY(v_ids) AND x.expires_at <= v_now
         ORDER BY x.resource, lower(x.span) FOR UPDATE SKIP LOCKED));

    WITH old AS (
        SELECT r.request_id FROM {s}.requests r WHERE r.created_at <= v_cutoff
         LIMIT p_batch FOR UPDATE SKIP LOCKED
    )
    DELETE FROM {s}.requests r USING old WHERE r.request_id = old.request_id;
    GET DIAGNOSTICS purged_requests = ROW_COUNT;
END
$$;


CREATE OR REPLACE FUNCTION {s}.take_all(
    p_id bigint, p_expires timestamptz, p_now timestamptz,
    p_ures text[], p_uslot text[],
    p_sres text[], p_skind text[], p_slo numeric[], p_shi numeric[],
    OUT taken integer[], OUT blockers bigint[], OUT dead bigint[]
) LANGUAGE plpgsql AS $$
DECLARE
    v_nu integer := coalesce(array_length(p_ures, 1), 0);
    v_ns integer := coalesce(array_length(p_sres, 1), 0);
    v_lost integer := 0;  -- position (units, then spans; from 1) of the first loss
    v_other bigint;
    v_exp timestamptz;
    v_rng numrange;
    v_ids bigint[];
    v_more integer[];
BEGIN
    taken := '{}'; blockers := '{}'; dead := '{}';
    FOR i IN 1 .. v_nu LOOP
        LOOP
            -- Linearization point for a free unit: the insert against the primary key.
            INSERT INTO {s}.units (resource, slot, claim_id, expires_at)
            VALUES (p_ures[i], p_uslot[i], p_id, p_expires)
            ON CONFLICT DO NOTHING;
            EXIT WHEN FOUND;
            SELECT u.claim_id, u.expires_at INTO v_other, v_exp FROM {s}.units u
             WHERE u.resource = p_ures[i] AND u.slot = p_uslot[i] FOR UPDATE;
            CONTINUE WHEN NOT FOUND;  -- released since the insert: insert again
            IF v_exp IS NOT NULL AND v_exp <= p_now THEN
                -- Lazy takeover: a conditional write on the dead hold observed
                -- (and row-locked) above; a confirm racing it waits on that lock.
                UPDATE {s}.units u SET claim_id = p_id, expires_at = p_expires
                 WHERE u.resource = p_ures[i] AND u.slot = p_uslot[i] AND u.claim_id = v_other;
                dead := dead || v_other;
            ELSE
                taken := taken || (i - 1); blockers := blockers || v_other; v_lost := i;
            END IF;
            EXIT;
        END LOOP;
        EXIT WHEN v_lost > 0;
    END LOOP;
    IF v_lost = 0 THEN
        FOR j IN 1 .. v_ns LOOP
            v_rng := numrange(p_slo[j], p_shi[j], '[)');
            LOOP
                -- Clear dead spans in the way: overlapping ones (taken over) and
                -- any of the other kind (they would trip spans_one_kind).
                WITH gone AS (
                    DELETE FROM {s}.spans s
                     WHERE s.resource = p_sres[j] AND (s.span && v_rng OR s.kind <> p_skind[j])
                       AND s.expires_at <= p_now
                    RETURNING s.claim_id, s.kind
                )
                SELECT coalesce(array_agg(g.claim_id) FILTER (WHERE g.kind = p_skind[j]), '{}')
                  INTO v_ids FROM gone g;
                dead := dead || v_ids;
                -- Linearization point for a span: the insert against both exclusion
                -- constraints (it waits for any uncommitted overlapping insert).
                INSERT INTO {s}.spans (resource, kind, span, claim_id, expires_at)
                VALUES (p_sres[j], p_skind[j], v_rng, p_id, p_expires)
                ON CONFLICT DO NOTHING;
                EXIT WHEN FOUND;
                PERFORM {s}.check_span_kind(p_sres[j], p_skind[j], p_now, v_nu + j - 1);
                SELECT array_agg(s.claim_id) INTO v_ids FROM {s}.spans s
                 WHERE s.resource = p_sres[j] AND s.kind = p_skind[j] AND s.span && v_rng
                   AND (s.expires_at IS NULL OR s.expires_at > p_now);
                IF v_ids IS NOT NULL THEN
                    taken := taken || (v_nu + j - 1); blockers := blockers || v_ids;
                    v_lost := v_nu + j;
                    EXIT;
                END IF;
                -- The blocker ended or died after our insert saw it: try again.
            END LOOP;
            EXIT WHEN v_lost > 0;
        END LOOP;
    END IF;
    IF v_lost > 0 THEN
        -- A loser only looks at the rest, so that it learns every taken target;
        -- the caller rolls the attempt back.
        FOR j IN greatest(v_lost - v_nu, 0) + 1 .. v_ns LOOP
            PERFORM {s}.check_span_kind(p_sres[j], p_skind[j], p_now, v_nu + j - 1);
        END LOOP;
        SELECT coalesce(array_agg(DISTINCT x.idx), '{}'), coalesce(array_agg(x.claim_id), '{}')
          INTO v_more, v_ids
          FROM (
            SELECT t.k::integer - 1 AS idx, u.claim_id
              FROM unnest(p_ures, p_uslot) WITH ORDINALITY AS t(res, slot, k)
              JOIN {s}.units u ON u.resource = t.res AND u.slot = t.slot
             WHERE t.k > v_lost AND (u.expires_at IS NULL OR u.expires_at > p_now)
            UNION ALL
            SELECT v_nu + t.k::integer - 1, s.claim_id
              FROM unnest(p_sres, p_skind, p_slo, p_shi) WITH ORDINALITY AS t(res, kind, lo, hi, k)
              JOIN {s}.spans s ON s.resource = t.res AND s.kind = t.kind
                              AND s.span && numrange(t.lo, t.hi, '[)')
             WHERE v_nu + t.k > v_lost AND (s.expires_at IS NULL OR s.expires_at > p_now)
          ) x;
        taken := taken || v_more;
        blockers := blockers || v_ids;
    ELSIF cardinality(dead) > 0 THEN
        -- Claim rows last, in id order (the module's lock order).
        UPDATE {s}.claims c SET state = 'expired', taken_over = true, updated_at = p_now
         WHERE c.id IN (SELECT DISTINCT d FROM unnest(dead) d ORDER BY d) AND c.state = 'held';
    END IF;
END
$$;
