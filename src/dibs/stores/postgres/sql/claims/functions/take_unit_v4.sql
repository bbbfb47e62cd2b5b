DROP FUNCTION IF EXISTS {s}.take_unit_v4({s}.units_v4, timestamptz);
-- take_unit_v4: acquire one unit row for p_row (a single-unit claim, or a
-- 'member' row of a group claim). The insert is the check; a released claim,
-- a free row or a dead hold found there is replaced by a conditional UPDATE
-- on the row observed (never a bare row lock: the UPDATE follows any lock taken,
-- so a plain confirm waiting on this row always re-checks its conditions), and
-- the claim replaced is copied
-- into claims_v4 (released, or expired and taken over) with its request ID
-- moved to a reservation row. Outcomes: 'granted' (other = the dead group
-- claim taken over, if any) or 'taken' (other = the live claim in the way).
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
-- A single-unit claim (p_ttl given or not, p_row.state not 'member') is dated
-- from a clock read after the row was looked at (and, to replace a claim,
-- under its row lock), so it never seems to begin before a release it saw or
-- a write it waited for; p_clock is the test clock, or NULL.
CREATE OR REPLACE FUNCTION {s}.take_unit_v4(
    p_row {s}.units_v4, p_now timestamptz, p_clock timestamptz, p_ttl double precision,
    OUT outcome text, OUT other bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_o {s}.units_v4;
    v_stamp timestamptz;
BEGIN
    LOOP
        -- A plain read first: a fence is drawn only for a take that should
        -- succeed, so a refusal never spends one.
        SELECT * INTO v_o FROM {s}.units_v4 u
         WHERE u.resource = p_row.resource AND u.slot = p_row.slot;
        IF NOT FOUND THEN
            IF p_row.state <> 'member' THEN
                v_stamp := coalesce(p_clock, clock_timestamp());
                p_row.created_at := v_stamp;
                p_row.updated_at := v_stamp;
                p_row.expires_at := CASE WHEN p_ttl IS NULL THEN NULL
                                         ELSE v_stamp + make_interval(secs => p_ttl) END;
            END IF;
            -- Linearization point for a free unit: the insert against the primary key.
            INSERT INTO {s}.units_v4 (resource, slot, id, holder, state, fence, expires_at,
                                      created_at, updated_at)
            VALUES (p_row.resource, p_row.slot, p_row.id, p_row.holder, p_row.state,
                    CASE WHEN p_row.state = 'member' THEN 0 ELSE nextval('{s}.fences') END,
                    p_row.expires_at, p_row.created_at, p_row.updated_at)
            ON CONFLICT (resource, slot) DO NOTHING;
            IF FOUND THEN
                outcome := 'granted';
                RETURN;
            END IF;
            CONTINUE;  -- inserted by another since the read: look again
        END IF;
        IF v_o.state IN ('held', 'confirmed', 'member')
           AND (v_o.expires_at IS NULL OR v_o.expires_at > p_now) THEN
            outcome := 'taken';
            other := v_o.id;
            RETURN;
        END IF;
        IF p_row.state <> 'member' THEN
            -- A single-unit claim is dated from a clock read under the row
            -- lock, which the UPDATE below then keeps: whatever held the lock
            -- before (a confirm of the dead hold answering 'expired' on its
            -- clock, a sweep) read its clock earlier, so this claim never
            -- seems to begin before a change it waited for. (The lock is not
            -- left bare: the UPDATE, on the same conditions, follows.)
            PERFORM 1 FROM {s}.units_v4 u
             WHERE u.resource = v_o.resource AND u.slot = v_o.slot
               AND u.id = v_o.id AND u.fence = v_o.fence
               AND (u.state IN ('free', 'released', 'expired')
                    OR (u.state IN ('held', 'member') AND u.expires_at <= p_now))
               FOR UPDATE;
            CONTINUE WHEN NOT FOUND;  -- it changed under us: look again
            v_stamp := coalesce(p_clock, clock_timestamp());
            p_row.created_at := v_stamp;
            p_row.updated_at := v_stamp;
            p_row.expires_at := CASE WHEN p_ttl IS NULL THEN NULL
                                     ELSE v_stamp + make_interval(secs => p_ttl) END;
        END IF;
        -- Linearization point for a takeover or a reuse: the conditional write
        -- on the claim observed; the fence is drawn under its row lock.
        UPDATE {s}.units_v4 u
           SET id = p_row.id, holder = p_row.holder, state = p_row.state,
               fence = CASE WHEN p_row.state = 'member' THEN 0
                            ELSE nextval('{s}.fences') END,
               expires_at = p_row.expires_at, taken_over = false, request_id = NULL,
               fingerprint = NULL, taken = NULL, created_at = p_row.created_at,
               updated_at = p_row.updated_at
         WHERE u.resource = v_o.resource AND u.slot = v_o.slot
           AND u.id = v_o.id AND u.fence = v_o.fence
           AND (u.state IN ('free', 'released', 'expired')
                OR (u.state IN ('held', 'member') AND u.expires_at <= p_now));
        CONTINUE WHEN NOT FOUND;  -- it changed under us: look again
        IF v_o.state IN ('released', 'held', 'expired') THEN
            PERFORM {s}.archive_v4(v_o, p_now);
        ELSIF v_o.state = 'member' AND v_o.id = 0 THEN
            -- A marker whose readers all died (shared_v5.sql): they are taken over.
            PERFORM {s}.take_over_readers_v5(v_o.resource, v_o.slot, p_now);
        ELSIF v_o.state = 'member' THEN
            other := v_o.id;
        END IF;
        outcome := 'granted';
        RETURN;
    END LOOP;
END
$$;

-- archive_v4: copy a unit claim replaced in its row into claims_v4, and keep
-- its request ID in a reservation row.
CREATE OR REPLACE FUNCTION {s}.archive_v4(p_o {s}.units_v4, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.claims_v4 (id, holder, targets, state, fence, expires_at, taken_over,
                               request_id, created_at, updated_at)
    VALUES (p_o.id, p_o.holder,
            jsonb_build_array(jsonb_build_array('u', p_o.resource, p_o.slot))::text,
            CASE WHEN p_o.state = 'released' THEN 'released' ELSE 'expired' END, p_o.fence,
            p_o.expires_at, p_o.state <> 'released', p_o.request_id, p_o.created_at,
            CASE WHEN p_o.state = 'released' THEN p_o.updated_at ELSE p_now END)
    ON CONFLICT (id) DO NOTHING;
    IF p_o.fingerprint IS NOT NULL THEN
        INSERT INTO {s}.units_v4 (resource, slot, id, state, fence, request_id, fingerprint,
                                  created_at, updated_at)
        VALUES ('', p_o.request_id, p_o.id, 'request', 0, p_o.request_id, p_o.fingerprint,
                p_o.created_at, p_o.created_at)
        ON CONFLICT DO NOTHING;
    END IF;
END
$$;
