-- The job tables of a PostgreSQL schema before they were versioned (frozen; {s}: the schema).

CREATE TABLE IF NOT EXISTS {s}.jobs (
    id               text PRIMARY KEY,
    name             text NOT NULL,
    args             text NOT NULL,
    run_at           double precision NOT NULL,
    attempt          integer NOT NULL,
    max_attempts     integer NOT NULL,
    state            text NOT NULL,
    fence            bigint,
    claim_id         text,
    outcome_kind     text,
    outcome          text,
    schedule_id      text,
    retries          integer NOT NULL,
    failures         integer NOT NULL,
    key              text,
    cancel_requested boolean NOT NULL DEFAULT false,
    finished_at      double precision
);
CREATE INDEX IF NOT EXISTS jobs_due ON {s}.jobs (run_at) WHERE state IN ('pending', 'running');
CREATE UNIQUE INDEX IF NOT EXISTS jobs_live_key
    ON {s}.jobs (key) WHERE state IN ('pending', 'running');
CREATE INDEX IF NOT EXISTS jobs_live_schedule
    ON {s}.jobs (schedule_id) WHERE state IN ('pending', 'running');
CREATE TABLE IF NOT EXISTS {s}.job_schedules (
    id        text PRIMARY KEY,
    watermark double precision
);
