-- transition: confirm, extend or release one claim. Status 'ok', or why not:
-- not_found, not_holder, fence, released, expired, taken_over.
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
CREATE OR REPLACE FUNCTION {s}.transition(
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
    PERFORM 1 FROM {s}.units u WHERE u.claim_id = p_id ORDER BY u.resource COLLATE "C", u.slot COLLATE "C" FOR UPDATE;
    PERFORM 1 FROM {s}.spans s WHERE s.claim_id = p_id
      ORDER BY s.resource COLLATE "C", lower(s.span) FOR UPDATE;
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
