-- take_all_v4: acquire every target of one group or span claim in the given
-- (sorted) order: its units as 'member' rows (take_unit_v4), then its spans.
-- Returns the indexes of taken targets, the live claims that blocked them and
-- the dead group claims taken over. After the first loss it only looks, so a
-- loser learns every taken target; the caller rolls the attempt back. With
-- p_shared it takes them as a reader: its units through take_reader_v5, its
-- spans with the readers range [p_id, p_id + 1), which overlaps a writer's
-- (unbounded) but no other reader's; live readers are then no blockers, and
-- only dead writers' spans are taken over (a dead reader is a writer's to
-- take over).
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
CREATE OR REPLACE FUNCTION {s}.take_all_v4(
    p_id bigint, p_expires timestamptz, p_now timestamptz,
    p_ures text[], p_uslot text[],
    p_sres text[], p_skind text[], p_slo numeric[], p_shi numeric[], p_shared boolean,
    OUT taken integer[], OUT blockers bigint[], OUT dead bigint[]
) LANGUAGE plpgsql AS $$
DECLARE
    v_nu integer := coalesce(array_length(p_ures, 1), 0);
    v_ns integer := coalesce(array_length(p_sres, 1), 0);
    v_lost integer := 0;  -- position (units, then spans; from 1) of the first loss
    v_got record;
    v_rng numrange;
    v_ids bigint[];
    v_more integer[];
    v_mode int8range := CASE WHEN p_shared THEN int8range(p_id, p_id + 1)
                             ELSE int8range(NULL, NULL) END;
BEGIN
    taken := '{}'; blockers := '{}'; dead := '{}';
    FOR i IN 1 .. v_nu LOOP
        IF p_shared THEN
            SELECT * INTO v_got FROM {s}.take_reader_v5(p_ures[i], p_uslot[i], p_id, p_now);
        ELSE
            SELECT * INTO v_got FROM {s}.take_unit_v4(
                ROW(p_ures[i], p_uslot[i], p_id, NULL, 'member', 0, p_expires, false, NULL,
                    NULL, NULL, p_now, p_now)::{s}.units_v4, p_now, NULL, NULL);
        END IF;
        IF v_got.outcome = 'taken' THEN
            taken := taken || (i - 1); blockers := blockers || v_got.other; v_lost := i;
            EXIT;
        ELSIF v_got.other IS NOT NULL THEN
            dead := dead || v_got.other;
        END IF;
    END LOOP;
    IF v_lost = 0 THEN
        FOR j IN 1 .. v_ns LOOP
            v_rng := numrange(p_slo[j], p_shi[j], '[)');
            LOOP
                -- Take over the dead spans in the way: overlapping ones, and any
                -- of the other kind (they would trip spans_one_kind; a live one
                -- would have blocked this claim). Rows locked in span order, the
                -- order transition_v4() locks them in.
                WITH gone AS (
                    DELETE FROM {s}.spans_v4 s WHERE s.ctid = ANY(ARRAY(
                        SELECT x.ctid FROM {s}.spans_v4 x
                         WHERE x.resource = p_sres[j]
                           AND ((x.span && v_rng AND x.readers && v_mode)
                                OR x.kind <> p_skind[j])
                           AND x.expires_at <= p_now
                         ORDER BY lower(x.span) FOR UPDATE))
                    RETURNING s.claim_id
                )
                SELECT coalesce(array_agg(g.claim_id), '{}') INTO v_ids FROM gone g;
                dead := dead || v_ids;
                -- Linearization point for a span: the insert against both exclusion
                -- constraints (it waits for any uncommitted overlapping insert).
                INSERT INTO {s}.spans_v4 (resource, kind, span, claim_id, expires_at, readers)
                VALUES (p_sres[j], p_skind[j], v_rng, p_id, p_expires, v_mode)
                ON CONFLICT DO NOTHING;
                EXIT WHEN FOUND;
                PERFORM {s}.check_span_kind_v4(p_sres[j], p_skind[j], p_now, v_nu + j - 1);
                SELECT array_agg(s.claim_id) INTO v_ids FROM {s}.spans_v4 s
                 WHERE s.resource = p_sres[j] AND s.kind = p_skind[j] AND s.span && v_rng
                   AND s.readers && v_mode AND (s.expires_at IS NULL OR s.expires_at > p_now);
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
        -- the caller rolls the attempt back. The first loss was seen by a plain
        -- read (no row lock), so it is looked at again with the rest, in one
        -- statement: the taken set is that of one instant. If its blocker is
        -- gone by then and nothing else is taken, taken is {-1}: try again.
        FOR j IN greatest(v_lost - v_nu, 0) + 1 .. v_ns LOOP
            PERFORM {s}.check_span_kind_v4(p_sres[j], p_skind[j], p_now, v_nu + j - 1);
        END LOOP;
        SELECT coalesce(array_agg(DISTINCT x.idx), '{}'), coalesce(array_agg(x.claim_id), '{}')
          INTO v_more, v_ids
          FROM (
            SELECT t.k::integer - 1 AS idx, u.id AS claim_id
              FROM unnest(p_ures, p_uslot) WITH ORDINALITY AS t(res, slot, k)
              JOIN {s}.units_v4 u ON u.resource = t.res AND u.slot = t.slot
             WHERE t.k >= v_lost AND u.state IN ('held', 'confirmed', 'member')
               AND (u.expires_at IS NULL OR u.expires_at > p_now)
               AND NOT (p_shared AND u.state = 'member' AND u.id = 0)
            UNION ALL
            SELECT v_nu + t.k::integer - 1, s.claim_id
              FROM unnest(p_sres, p_skind, p_slo, p_shi) WITH ORDINALITY AS t(res, kind, lo, hi, k)
              JOIN {s}.spans_v4 s ON s.resource = t.res AND s.kind = t.kind
                              AND s.span && numrange(t.lo, t.hi, '[)')
                              AND s.readers && v_mode
             WHERE v_nu + t.k >= v_lost AND (s.expires_at IS NULL OR s.expires_at > p_now)
          ) x;
        taken := CASE WHEN cardinality(v_more) > 0 THEN v_more ELSE ARRAY[-1] END;
        blockers := v_ids;
    ELSIF cardinality(dead) > 0 THEN
        PERFORM {s}.take_over_v4(dead, p_now);
    END IF;
END
$$;

-- take_over_v4: mark dead group claims taken over. Claim rows last, in id
-- order (the module's lock order); whether or not a sweep marked them
-- expired already.
CREATE OR REPLACE FUNCTION {s}.take_over_v4(p_dead bigint[], p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {s}.claims_v4 c WHERE c.id = ANY(p_dead) ORDER BY c.id FOR UPDATE;
    UPDATE {s}.claims_v4 c SET state = 'expired', taken_over = true, updated_at = p_now
     WHERE c.id = ANY(p_dead) AND c.state IN ('held', 'expired') AND NOT c.taken_over;
END
$$;
