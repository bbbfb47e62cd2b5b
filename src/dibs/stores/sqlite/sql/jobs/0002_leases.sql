-- Version 2: the attempt's lease lives on the row (holder, fence, lease_expires),
-- so taking a job is one UPDATE … RETURNING and finishing one fenced UPDATE;
-- named queues, priorities, lock keys, per-row retention, the attempts log.
-- A row running under version 1 gets no lease: the first reclaim after the upgrade
-- counts its attempt as lost and runs the job again (at-least-once, as always).

ALTER TABLE dibs_jobs RENAME COLUMN claim_id TO holder;
ALTER TABLE dibs_jobs ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';
ALTER TABLE dibs_jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dibs_jobs ADD COLUMN lock_key TEXT;
ALTER TABLE dibs_jobs ADD COLUMN lease_expires REAL;
ALTER TABLE dibs_jobs ADD COLUMN started_at REAL;
ALTER TABLE dibs_jobs ADD COLUMN enqueued_at REAL;
ALTER TABLE dibs_jobs ADD COLUMN retention REAL;
ALTER TABLE dibs_jobs ADD COLUMN attempts_log TEXT;
UPDATE dibs_jobs SET outcome_kind = NULL, outcome = NULL WHERE state = 'running';
DROP INDEX IF EXISTS dibs_jobs_due;
CREATE INDEX dibs_jobs_take ON dibs_jobs (priority DESC, run_at, id) WHERE state = 'pending';
CREATE INDEX dibs_jobs_lease ON dibs_jobs (lease_expires) WHERE state = 'running';
CREATE INDEX dibs_jobs_running_lock ON dibs_jobs (lock_key)
    WHERE state = 'running' AND lock_key IS NOT NULL;
CREATE INDEX dibs_jobs_pending_lock ON dibs_jobs (lock_key, run_at, id)
    WHERE state = 'pending' AND lock_key IS NOT NULL;
