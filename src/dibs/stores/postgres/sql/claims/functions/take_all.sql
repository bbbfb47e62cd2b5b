-- take_all: acquire every target of one claim in the given (sorted) order.
-- Returns the indexes of taken targets, the live claims that blocked them and
-- the dead holds taken over. After the first loss it only looks, so a loser
-- learns every taken target; the caller rolls the attempt back.
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
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
                -- Take over the dead spans in the way: overlapping ones, and any
                -- of the other kind (they would trip spans_one_kind; a live one
                -- would have blocked this claim). Rows locked in span order, the
                -- order transition() locks them in.
                WITH gone AS (
                    DELETE FROM {s}.spans s WHERE s.ctid = ANY(ARRAY(
                        SELECT x.ctid FROM {s}.spans x
                         WHERE x.resource = p_sres[j]
                           AND (x.span && v_rng OR x.kind <> p_skind[j])
                           AND x.expires_at <= p_now
                         ORDER BY lower(x.span) FOR UPDATE))
                    RETURNING s.claim_id
                )
                SELECT coalesce(array_agg(g.claim_id), '{}') INTO v_ids FROM gone g;
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
        -- Claim rows last, in id order (the module's lock order). A dead hold
        -- is taken over whether or not a sweep marked it expired already.
        PERFORM 1 FROM {s}.claims c WHERE c.id = ANY(dead) ORDER BY c.id FOR UPDATE;
        UPDATE {s}.claims c SET state = 'expired', taken_over = true, updated_at = p_now
         WHERE c.id = ANY(dead) AND c.state IN ('held', 'expired') AND NOT c.taken_over;
    END IF;
END
$$;
