-- Stubs for the version-3 entry points: a process still running version-3 code
-- after another upgraded the schema to version 4 gets DB009 naming the cause,
-- never a claim written into tables whose meaning changed.
--
-- Recreated from this file whenever the schema is upgraded (dibs.stores._migrate).
CREATE OR REPLACE FUNCTION {s}.schema_moved_v4() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the dibs schema was upgraded to version 4 while this process ran '
        'code for an older version: upgrade dibs in this process and restart it'
        USING ERRCODE = 'DB009';
END
$$;
CREATE OR REPLACE FUNCTION {s}.claim(
    text, text, double precision, text, text, timestamptz, double precision,
    text[], text[], text[], text[], numeric[], numeric[]
) RETURNS TABLE (
    outcome text, taken integer[], id bigint, holder text, targets text, state text,
    fence bigint, expires_at timestamptz, taken_over boolean, request_id text,
    created_at timestamptz, updated_at timestamptz, now timestamptz
) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.schema_moved_v4();
END
$$;
CREATE OR REPLACE FUNCTION {s}.transition(
    text, bigint, text, bigint, double precision, timestamptz
) RETURNS TABLE (
    status text, id bigint, holder text, targets text, state text, fence bigint,
    expires_at timestamptz, taken_over boolean, request_id text,
    created_at timestamptz, updated_at timestamptz, now timestamptz
) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.schema_moved_v4();
END
$$;
CREATE OR REPLACE FUNCTION {s}.sweep(
    timestamptz, double precision, integer,
    OUT expired integer, OUT purged_claims integer, OUT purged_requests integer
) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.schema_moved_v4();
END
$$;
