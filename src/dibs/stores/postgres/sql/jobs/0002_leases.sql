-- Version 2: the attempt's lease lives on the row (holder, fence, lease_expires),
-- so taking a job is one UPDATE … FOR UPDATE SKIP LOCKED and finishing one fenced
-- UPDATE; named queues, priorities, lock keys, per-row retention, the attempts log.
-- A row running under version 1 gets no lease: the first reclaim after the upgrade
-- counts its attempt as lost and runs the job again (at-least-once, as always).

ALTER TABLE {s}.jobs RENAME COLUMN claim_id TO holder;
ALTER TABLE {s}.jobs
    ADD COLUMN queue         text NOT NULL DEFAULT 'default',
    ADD COLUMN priority      integer NOT NULL DEFAULT 0,
    ADD COLUMN lock_key      text,
    ADD COLUMN lease_expires double precision,
    ADD COLUMN started_at    double precision,
    ADD COLUMN enqueued_at   double precision,
    ADD COLUMN retention     double precision,
    ADD COLUMN attempts_log  text;
UPDATE {s}.jobs SET outcome_kind = NULL, outcome = NULL WHERE state = 'running';
DROP INDEX IF EXISTS {s}.jobs_due;
CREATE INDEX jobs_take ON {s}.jobs (priority DESC, run_at, id) WHERE state = 'pending';
CREATE INDEX jobs_lease ON {s}.jobs (lease_expires) WHERE state = 'running';
CREATE INDEX jobs_running_lock ON {s}.jobs (lock_key)
    WHERE state = 'running' AND lock_key IS NOT NULL;
CREATE INDEX jobs_pending_lock ON {s}.jobs (lock_key, run_at, id)
    WHERE state = 'pending' AND lock_key IS NOT NULL;
