-- claim_by_id_v4: one claim wherever it lives: its unit row (a single-unit
-- claim) or claims_v4 (a group, span or shared claim, or a replaced unit
-- claim), with its mode ('exclusive' or 'shared') last.
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
CREATE OR REPLACE FUNCTION {s}.claim_by_id_v4(p_id bigint) RETURNS TABLE (
    id bigint, holder text, targets text, state text, fence bigint, expires_at timestamptz,
    taken_over boolean, request_id text, created_at timestamptz, updated_at timestamptz,
    mode text
) LANGUAGE sql STABLE AS $$
    (SELECT u.id, u.holder, jsonb_build_array(jsonb_build_array('u', u.resource, u.slot))::text,
            u.state, u.fence, u.expires_at, u.taken_over, u.request_id, u.created_at,
            u.updated_at, 'exclusive'::text
       FROM {s}.units_v4 u
      WHERE u.id = p_id AND u.state IN ('held', 'confirmed', 'released', 'expired')
     UNION ALL
     SELECT c.id, c.holder, c.targets, c.state, c.fence, c.expires_at, c.taken_over,
            c.request_id, c.created_at, c.updated_at, coalesce(c.mode, 'exclusive')
       FROM {s}.claims_v4 c WHERE c.id = p_id)
    LIMIT 1
$$;
