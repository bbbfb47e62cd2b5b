-- transition_v4: confirm, extend or release one claim when the plain statement
-- (Statements.confirm and friends) did not: a group or span claim, or a
-- single-unit claim that is not the caller's live hold. Status 'ok', or why
-- not: not_found, not_holder, fence, released, expired, taken_over. The
-- claim's mode comes last, after now (where version-4 code reads nothing).
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
CREATE OR REPLACE FUNCTION {s}.transition_v4(
    p_op text, p_id bigint, p_holder text, p_fence bigint, p_ttl double precision,
    p_now timestamptz
) RETURNS TABLE (
    status text, id bigint, holder text, targets text, state text, fence bigint,
    expires_at timestamptz, taken_over boolean, request_id text,
    created_at timestamptz, updated_at timestamptz, now timestamptz, mode text
) LANGUAGE plpgsql AS $$
DECLARE
    v_claim {s}.claims_v4;
    v_u {s}.units_v4;
    v_now timestamptz;
    v_status text := 'ok';
    v_expires timestamptz;
    v_locked boolean := false;
    v_r record;
BEGIN
    -- A single-unit claim in its row: judged on a plain read, changed by a
    -- conditional UPDATE (as the plain statements do). A dead hold is judged
    -- again under the row lock, with the clock read after it: a takeover in
    -- flight on this row (its created_at read, its commit not yet visible)
    -- is waited for, so the answer is taken_over, never an 'expired' dated
    -- after that takeover. The other answers need no lock (nor its WAL): holder
    -- and fence never change, and a released claim stays 'released' when a
    -- later claim replaces it.
    LOOP
        IF v_locked THEN
            SELECT * INTO v_u FROM {s}.units_v4 u
             WHERE u.id = p_id AND u.state IN ('held', 'confirmed', 'released', 'expired')
               FOR NO KEY UPDATE;
        ELSE
            SELECT * INTO v_u FROM {s}.units_v4 u
             WHERE u.id = p_id AND u.state IN ('held', 'confirmed', 'released', 'expired');
        END IF;
        EXIT WHEN NOT FOUND;  -- replaced (now in claims_v4), or never a unit claim
        v_now := coalesce(p_now, clock_timestamp());
        IF v_u.holder <> p_holder THEN
            v_status := 'not_holder';
        ELSIF v_u.fence <> p_fence THEN
            v_status := 'fence';
        ELSIF NOT v_locked AND (v_u.state = 'expired'
                                OR (v_u.state = 'held' AND v_u.expires_at <= v_now)) THEN
            v_locked := true;
            CONTINUE;  -- look again under the row lock
        ELSIF v_u.state = 'released' THEN
            v_status := 'released';
        ELSIF v_u.state = 'expired' OR (v_u.state = 'held' AND v_u.expires_at <= v_now) THEN
            v_status := 'expired';  -- still in its row: nothing has taken it over
        ELSIF p_op = 'release' THEN
            UPDATE {s}.units_v4 u SET state = 'released', expires_at = NULL, updated_at = v_now
             WHERE u.id = p_id AND u.holder = p_holder AND u.fence = p_fence
               AND (u.state = 'confirmed' OR (u.state = 'held' AND u.expires_at > v_now))
            RETURNING * INTO v_u;
            CONTINUE WHEN NOT FOUND;
        ELSIF v_u.state = 'held' THEN
            v_expires := CASE WHEN p_op = 'extend' THEN v_now + make_interval(secs => p_ttl) END;
            UPDATE {s}.units_v4 u
               SET state = CASE WHEN p_op = 'confirm' THEN 'confirmed' ELSE 'held' END,
                   expires_at = v_expires, updated_at = v_now
             WHERE u.id = p_id AND u.holder = p_holder AND u.fence = p_fence
               AND u.state = 'held' AND u.expires_at > v_now
            RETURNING * INTO v_u;
            CONTINUE WHEN NOT FOUND;
        END IF;
        RETURN QUERY SELECT v_status, c.id, c.holder, c.targets, c.state, c.fence,
            c.expires_at, c.taken_over, c.request_id, c.created_at, c.updated_at, v_now, c.mode
            FROM {s}.claim_by_id_v4(p_id) c;
        RETURN;
    END LOOP;

    -- A group, span or shared claim, or an archived one: its member rows (a
    -- reader's: the markers of its units), its span rows, then its claim row:
    -- the lock order a claimant taking over these targets follows too.
    PERFORM 1 FROM {s}.units_v4 u WHERE u.id = p_id AND u.state = 'member'
      ORDER BY u.resource COLLATE "C", u.slot COLLATE "C" FOR UPDATE;
    PERFORM 1 FROM {s}.units_v4 u
      JOIN {s}.readers_v5 r ON r.resource = u.resource AND r.slot = u.slot
     WHERE r.claim_id = p_id
     ORDER BY u.resource COLLATE "C", u.slot COLLATE "C" FOR UPDATE OF u;
    PERFORM 1 FROM {s}.spans_v4 s WHERE s.claim_id = p_id
      ORDER BY s.resource COLLATE "C", lower(s.span) FOR UPDATE;
    SELECT * INTO v_claim FROM {s}.claims_v4 c WHERE c.id = p_id FOR UPDATE;
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
        UPDATE {s}.claims_v4 c SET state = 'released', expires_at = NULL, updated_at = v_now
         WHERE c.id = p_id AND c.holder = p_holder AND c.fence = p_fence
           AND (c.state = 'confirmed' OR (c.state = 'held' AND c.expires_at > v_now))
        RETURNING * INTO v_claim;
        -- Member rows stay as 'free' rows: a later claim on the unit updates
        -- them, drawing its fence under the row lock.
        UPDATE {s}.units_v4 u SET state = 'free', expires_at = NULL, updated_at = v_now
         WHERE u.id = p_id AND u.state = 'member';
        DELETE FROM {s}.spans_v4 s WHERE s.claim_id = p_id;
        -- A reader leaves its units (whose markers it locked above).
        FOR v_r IN DELETE FROM {s}.readers_v5 r WHERE r.claim_id = p_id
                   RETURNING r.resource, r.slot LOOP
            PERFORM {s}.refresh_marker_v5(v_r.resource, v_r.slot, v_now);
        END LOOP;
    ELSIF v_claim.state = 'held' THEN
        v_expires := CASE WHEN p_op = 'extend' THEN v_now + make_interval(secs => p_ttl) END;
        UPDATE {s}.claims_v4 c
           SET state = CASE WHEN p_op = 'confirm' THEN 'confirmed' ELSE 'held' END,
               expires_at = v_expires, updated_at = v_now
         WHERE c.id = p_id AND c.holder = p_holder AND c.fence = p_fence
           AND c.state = 'held' AND c.expires_at > v_now
        RETURNING * INTO v_claim;
        UPDATE {s}.units_v4 u SET expires_at = v_expires WHERE u.id = p_id AND u.state = 'member';
        UPDATE {s}.spans_v4 s SET expires_at = v_expires WHERE s.claim_id = p_id;
        IF v_claim.mode = 'shared' THEN
            PERFORM {s}.refresh_marker_v5(r.resource, r.slot, v_now)
               FROM {s}.readers_v5 r WHERE r.claim_id = p_id;
        END IF;
    END IF;
    RETURN QUERY SELECT v_status, v_claim.id, v_claim.holder, v_claim.targets,
        v_claim.state, v_claim.fence, v_claim.expires_at, v_claim.taken_over,
        v_claim.request_id, v_claim.created_at, v_claim.updated_at, v_now,
        coalesce(v_claim.mode, 'exclusive');
END
$$;
