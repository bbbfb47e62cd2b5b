-- Readers on units (schema version 5, see 0005_shared_holds.sql): a unit held
-- by readers has a marker row in units_v4 ('member', id 0, fence 0) whose
-- expiry is the latest of its readers' (NULL while one is confirmed), and one
-- readers_v5 row per reader. Every change to a unit's readers is made under
-- the marker's row lock, taken first (the module's lock order: unit rows,
-- span rows, claim rows), and the expiry is written before the lock goes, so
-- a writer's conditional update of a dead marker, re-checked under that lock,
-- never takes a unit a reader just joined.
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).

-- take_reader_v5: add reader p_id to one unit. Outcomes: 'granted' (other = a
-- dead group claim taken over, if any) or 'taken' (other = the live claim in
-- the way). The marker's expiry is set by refresh_marker_v5 once the claim's
-- row exists (before the commit, under the lock taken here).
CREATE OR REPLACE FUNCTION {s}.take_reader_v5(
    p_res text, p_slot text, p_id bigint, p_now timestamptz,
    OUT outcome text, OUT other bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_o {s}.units_v4;
BEGIN
    LOOP
        SELECT * INTO v_o FROM {s}.units_v4 u
         WHERE u.resource = p_res AND u.slot = p_slot FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO {s}.units_v4 (resource, slot, id, state, fence, expires_at,
                                      created_at, updated_at)
            VALUES (p_res, p_slot, 0, 'member', 0, p_now, p_now, p_now)
            ON CONFLICT (resource, slot) DO NOTHING;
            CONTINUE WHEN NOT FOUND;  -- inserted by another since the read: look again
        ELSIF v_o.state = 'member' AND v_o.id = 0 THEN
            NULL;  -- readers there, live or dead: join them
        ELSIF v_o.state IN ('held', 'confirmed', 'member')
              AND (v_o.expires_at IS NULL OR v_o.expires_at > p_now) THEN
            outcome := 'taken';
            other := v_o.id;
            RETURN;
        ELSE
            -- Released, free, or a dead writer's: the row becomes the marker
            -- (under the lock taken above), the claim it held is archived or
            -- its group claim taken over, as take_unit_v4 does.
            UPDATE {s}.units_v4 u
               SET id = 0, holder = NULL, state = 'member', fence = 0, expires_at = p_now,
                   taken_over = false, request_id = NULL, fingerprint = NULL, taken = NULL,
                   created_at = p_now, updated_at = p_now
             WHERE u.resource = p_res AND u.slot = p_slot;
            IF v_o.state IN ('released', 'held', 'expired') THEN
                PERFORM {s}.archive_v4(v_o, p_now);
            ELSIF v_o.state = 'member' THEN
                other := v_o.id;
            END IF;
        END IF;
        INSERT INTO {s}.readers_v5 (resource, slot, claim_id) VALUES (p_res, p_slot, p_id)
        ON CONFLICT DO NOTHING;
        outcome := 'granted';
        RETURN;
    END LOOP;
END
$$;

-- refresh_marker_v5: set a unit's marker expiry from its readers (the caller
-- holds the marker's row lock); with no reader left the row becomes 'free'.
-- Readers gone from claims_v4 (purged by a sweep) or taken over count no more.
CREATE OR REPLACE FUNCTION {s}.refresh_marker_v5(p_res text, p_slot text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
    v_confirmed boolean;
    v_latest timestamptz;
BEGIN
    SELECT count(*), coalesce(bool_or(c.state = 'confirmed'), false), max(c.expires_at)
      INTO v_n, v_confirmed, v_latest
      FROM {s}.readers_v5 r JOIN {s}.claims_v4 c ON c.id = r.claim_id
     WHERE r.resource = p_res AND r.slot = p_slot
       AND c.state IN ('held', 'confirmed', 'expired') AND NOT c.taken_over;
    IF v_n = 0 THEN
        DELETE FROM {s}.readers_v5 r WHERE r.resource = p_res AND r.slot = p_slot;
        UPDATE {s}.units_v4 u SET state = 'free', expires_at = NULL, updated_at = p_now
         WHERE u.resource = p_res AND u.slot = p_slot AND u.state = 'member' AND u.id = 0;
    ELSE
        UPDATE {s}.units_v4 u
           SET expires_at = CASE WHEN v_confirmed THEN NULL ELSE v_latest END
         WHERE u.resource = p_res AND u.slot = p_slot AND u.state = 'member' AND u.id = 0;
    END IF;
END
$$;

-- take_over_readers_v5: a writer took a dead marker (under its row lock): its
-- readers are gone from the unit, and those whose hold died are taken over.
CREATE OR REPLACE FUNCTION {s}.take_over_readers_v5(
    p_res text, p_slot text, p_now timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
BEGIN
    WITH gone AS (
        DELETE FROM {s}.readers_v5 r WHERE r.resource = p_res AND r.slot = p_slot
        RETURNING r.claim_id
    )
    SELECT coalesce(array_agg(g.claim_id), '{}') INTO v_ids FROM gone g;
    IF cardinality(v_ids) > 0 THEN
        PERFORM {s}.take_over_v4(v_ids, p_now);
    END IF;
END
$$;
