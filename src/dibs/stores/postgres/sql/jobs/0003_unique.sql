-- Version 3: unique jobs (dibs.tasks.Unique). A job counts against its unique_key
-- while its state is in the bit mask unique_states (pending 1, running 2, done 4,
-- failed 8, cancelled 16), the partial unique index below is what enforces "one
-- job per key", in the same transaction as the insert (so a caller's rollback takes
-- the key back with the job). unique_until: when a job stops counting (NULL: never),
-- the next enqueue of the key clears an expired one's unique_key first.

ALTER TABLE {s}.jobs
    ADD COLUMN unique_key    text,
    ADD COLUMN unique_states integer,
    ADD COLUMN unique_until  double precision;
CREATE UNIQUE INDEX jobs_unique ON {s}.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND (unique_states & (CASE state WHEN 'pending' THEN 1
    WHEN 'running' THEN 2 WHEN 'done' THEN 4 WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16
    ELSE 0 END)) <> 0;
