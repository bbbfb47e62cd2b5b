-- The job tables of a SQLite file before they were versioned (frozen).

CREATE TABLE IF NOT EXISTS dibs_jobs (
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL,
    args             TEXT NOT NULL,
    run_at           REAL NOT NULL,
    attempt          INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    state            TEXT NOT NULL,
    fence            INTEGER,
    claim_id         TEXT,
    outcome_kind     TEXT,
    outcome          TEXT,
    schedule_id      TEXT,
    retries          INTEGER NOT NULL,
    failures         INTEGER NOT NULL,
    key              TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    finished_at      REAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dibs_jobs_due
    ON dibs_jobs (run_at) WHERE state IN ('pending', 'running');
CREATE UNIQUE INDEX IF NOT EXISTS dibs_jobs_live_key
    ON dibs_jobs (key) WHERE state IN ('pending', 'running');
CREATE INDEX IF NOT EXISTS dibs_jobs_live_schedule
    ON dibs_jobs (schedule_id) WHERE state IN ('pending', 'running');
CREATE TABLE IF NOT EXISTS dibs_job_schedules (
    id        TEXT PRIMARY KEY,
    watermark REAL NOT NULL
) WITHOUT ROWID;
