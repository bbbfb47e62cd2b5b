-- check_span_kind_v4: refuse a claim that would mix number and time spans on a
-- resource (SQLSTATE DB001). Recreated from this file on every upgrade.
CREATE OR REPLACE FUNCTION {s}.check_span_kind_v4(
    p_resource text, p_kind text, p_now timestamptz, p_index integer
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_kind text;
BEGIN
    SELECT s.kind INTO v_kind FROM {s}.spans_v4 s
     WHERE s.resource = p_resource AND s.kind <> p_kind
       AND (s.expires_at IS NULL OR s.expires_at > p_now)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'resource % holds % spans', p_resource, v_kind
            USING ERRCODE = 'DB001', DETAIL = p_index::text || ' ' || v_kind;
    END IF;
END
$$;
