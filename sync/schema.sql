-- aeroqueue sync: the tables of the MySQL copy of processed jobs
-- (design.md, flow "sync"; invariant 5). `aeroqueue sync` creates and
-- migrates them itself: nobody needs to run this file by hand.
--
-- One file for MySQL 8, MariaDB 10.5+ and SQLite (the file target used when
-- no MySQL URL is given): text inside /*! ... */ is run by MySQL and MariaDB
-- and is a comment to SQLite, so table options, character sets and secondary
-- indexes live there; a statement inside /*sqlite ... */ is SQLite's alone. JSON is stored as text (LONGTEXT with a JSON_VALID
-- check): the copy keeps what the job held, byte for byte.
--
-- Versions: a line "-- migration N: what it does" starts migration N. A run
-- applies the migrations above the highest version in schema_version, in
-- order, recording each. MySQL commits DDL implicitly, so a migration cannot
-- be atomic: every statement must be safe to run twice (IF NOT EXISTS), so a
-- run that died half-way through a migration finishes it the next time.
-- Never edit a migration that has shipped; add the next one. Migration 0
-- runs on every start and must stay idempotent. SQLite changes a table by
-- rebuilding it from the columns of before, which run twice takes away what
-- it added: a SQLite target whose schema_version is empty gets its version
-- back from its tables' shape (aeroqueue.sync.schema._sqlite_version), where
-- each migration that rebuilds a SQLite table must add its own.
--
-- Times are Unix milliseconds (BIGINT), as everywhere in aeroqueue.
-- A statement ends with ';' at the end of a line.

-- migration 0: the version table
CREATE TABLE IF NOT EXISTS schema_version (
    version     INT          NOT NULL PRIMARY KEY,
    description VARCHAR(200) NOT NULL,
    applied_at  BIGINT       NOT NULL
) /*! ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 */;

-- migration 1: processed jobs, list summaries, rejected records
CREATE TABLE IF NOT EXISTS aq_jobs (
    list      VARCHAR(64) /*! CHARACTER SET ascii COLLATE ascii_bin */ NOT NULL,
    -- The customer's job id (at most 200 bytes of UTF-8). Binary, so that ids
    -- differing only in case or in trailing spaces stay two rows.
    jid       VARBINARY(200) NOT NULL,
    token     BIGINT         NOT NULL,
    state     VARCHAR(8)     NOT NULL,
    attempts  INT            NOT NULL,
    payload   LONGTEXT       CHECK (payload IS NULL OR JSON_VALID(payload)),
    result    LONGTEXT       CHECK (result IS NULL OR JSON_VALID(result)),
    error     TEXT,
    done_at   BIGINT,
    synced_at BIGINT         NOT NULL,
    PRIMARY KEY (list, jid)
    /*! , KEY aq_jobs_by_token (list, token) */
) /*! ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin */;

CREATE TABLE IF NOT EXISTS aq_list_summary (
    list         VARCHAR(64) /*! CHARACTER SET ascii COLLATE ascii_bin */ NOT NULL PRIMARY KEY,
    mode         VARCHAR(8)  NOT NULL,
    total        BIGINT      NOT NULL,
    done         BIGINT      NOT NULL,
    dead         BIGINT      NOT NULL,
    sealed       SMALLINT    NOT NULL,
    complete     SMALLINT    NOT NULL,
    completed_at BIGINT,
    updated_at   BIGINT      NOT NULL
) /*! ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin */;

-- A processed job whose record could not be copied: its payload or result is
-- not JSON, or the database refused a value. The job stays unsynced in
-- Aerospike (so retention never deletes it) and is tried again by every run;
-- its row here goes once it has been copied.
CREATE TABLE IF NOT EXISTS sync_rejects (
    list    VARCHAR(64) /*! CHARACTER SET ascii COLLATE ascii_bin */ NOT NULL,
    token   BIGINT      NOT NULL,
    jid     TEXT        NOT NULL,
    state   VARCHAR(8)  NOT NULL,
    reason  TEXT        NOT NULL,
    seen_at BIGINT      NOT NULL,
    PRIMARY KEY (list, token)
) /*! ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin */;

-- migration 2: aq_jobs grows at its end: an auto-increment clustered key, (list, jid) unique
-- A sync reads jobs in digest order, which is no order of (list, jid): with
-- (list, jid) as InnoDB's clustered key, every batch wrote rows into pages all
-- over the table, and once the table outgrew the buffer pool each row cost a
-- random page read and write (1M rows went 3 to 5 times slower than the first
-- 100,000). Rows now go in at the end of an auto-increment key, and only the
-- small (list, jid) and (list, token) indexes take the random order. The
-- upsert still keys on (list, jid): the unique key is the only one a copied
-- row can collide on. MySQL cannot add a column "if not exists", so the ALTER
-- runs only while aq_jobs has no id column (a prepared statement picks it):
-- the migration can run again after dying half-way. One ALTER, one rebuild:
-- an old table is copied once, in place. SQLite keeps its table as it is:
-- its tables are already stored by rowid, in insertion order.
/*! SET @aq_has_id = (SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'aq_jobs' AND column_name = 'id') */;
/*! SET @aq_alter = IF(@aq_has_id = 0, 'ALTER TABLE aq_jobs DROP PRIMARY KEY, ADD COLUMN id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT FIRST, ADD PRIMARY KEY (id), ADD UNIQUE KEY aq_jobs_job (list, jid)', 'DO 0') */;
/*! PREPARE aq_migrate_2 FROM @aq_alter */;
/*! EXECUTE aq_migrate_2 */;
/*! DEALLOCATE PREPARE aq_migrate_2 */;

-- migration 3: SQLite: aq_jobs.jid holds job ids as text
-- SQLite read the jid column's VARBINARY(200) as NUMERIC affinity: an id
-- that looks like a number ('0123', '123.0', '1.23e2') was stored as one,
-- losing its text, and ids equal as numbers shared one row, the last copied
-- taking the others' place. MySQL's VARBINARY keeps the bytes, so these
-- statements are SQLite's alone: text inside /*sqlite ... */ is run by SQLite
-- and skipped for MySQL. The table is rebuilt with jid TEXT; the copy runs in
-- one transaction with the version row, and the first statement clears what
-- a run that died before its commit left. A row whose id was stored as a
-- number cannot be told back ('0123' and '123' both read 123): it is left
-- out, and `aeroqueue sync --resync` copies those jobs again, each once.
/*sqlite DROP TABLE IF EXISTS aq_jobs_v3 */;
/*sqlite CREATE TABLE aq_jobs_v3 (
    list      VARCHAR(64)    NOT NULL,
    jid       TEXT           NOT NULL,
    token     BIGINT         NOT NULL,
    state     VARCHAR(8)     NOT NULL,
    attempts  INT            NOT NULL,
    payload   LONGTEXT       CHECK (payload IS NULL OR JSON_VALID(payload)),
    result    LONGTEXT       CHECK (result IS NULL OR JSON_VALID(result)),
    error     TEXT,
    done_at   BIGINT,
    synced_at BIGINT         NOT NULL,
    PRIMARY KEY (list, jid)
) */;
/*sqlite INSERT INTO aq_jobs_v3 (list, jid, token, state, attempts, payload, result, error, done_at, synced_at)
    SELECT list, jid, token, state, attempts, payload, result, error, done_at, synced_at FROM aq_jobs
    WHERE typeof(jid) = 'text' */;
/*sqlite DROP TABLE aq_jobs */;
/*sqlite ALTER TABLE aq_jobs_v3 RENAME TO aq_jobs */;

-- migration 4: aq_jobs and aq_list_summary carry the list's stamp; a job's row is unique by (list, created, jid)
-- A list dropped and loaded again under its name is another list (its records
-- carry another stamp, `c`, the list's creation time). Keyed on (list, jid),
-- the new list's jobs took the old ones' rows: an old job processed and copied
-- was gone from the copy once the new job of its id was copied, and the old
-- jobs not reloaded stayed beside the new list's, counted as its. Each row now
-- names the list it was copied from (`created`, the list's stamp; the summary
-- names the list it counts, so `WHERE (list, created)` matches the two).
-- Rows copied before this migration hold created 0 (the stamp unknown): the
-- first copy of a job of their (list, jid) since takes their place, as a copy
-- took the row of its (list, jid) before (aeroqueue.sync.task).
-- SQLite rebuilds both tables (it cannot add a column "if not exists"): the
-- migration can run again on a file whose schema_version was dropped. Each
-- summary gets its stamp at the next sync (every run rewrites the summaries).
/*! SET @aq_has_created = (SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'aq_jobs' AND column_name = 'created') */;
/*! SET @aq_has_key = (SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'aq_jobs' AND index_name = 'aq_jobs_job') */;
/*! SET @aq_alter = IF(@aq_has_created = 0, CONCAT('ALTER TABLE aq_jobs ADD COLUMN created BIGINT NOT NULL DEFAULT 0 AFTER list, ', IF(@aq_has_key > 0, 'DROP INDEX aq_jobs_job, ', ''), 'ADD UNIQUE KEY aq_jobs_job (list, created, jid)'), 'DO 0') */;
/*! PREPARE aq_migrate_4 FROM @aq_alter */;
/*! EXECUTE aq_migrate_4 */;
/*! DEALLOCATE PREPARE aq_migrate_4 */;
/*! SET @aq_has_created = (SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'aq_list_summary' AND column_name = 'created') */;
/*! SET @aq_alter = IF(@aq_has_created = 0, 'ALTER TABLE aq_list_summary ADD COLUMN created BIGINT NOT NULL DEFAULT 0 AFTER list', 'DO 0') */;
/*! PREPARE aq_migrate_4s FROM @aq_alter */;
/*! EXECUTE aq_migrate_4s */;
/*! DEALLOCATE PREPARE aq_migrate_4s */;
/*sqlite DROP TABLE IF EXISTS aq_jobs_v4 */;
/*sqlite CREATE TABLE aq_jobs_v4 (
    list      VARCHAR(64)    NOT NULL,
    created   BIGINT         NOT NULL DEFAULT 0,
    jid       TEXT           NOT NULL,
    token     BIGINT         NOT NULL,
    state     VARCHAR(8)     NOT NULL,
    attempts  INT            NOT NULL,
    payload   LONGTEXT       CHECK (payload IS NULL OR JSON_VALID(payload)),
    result    LONGTEXT       CHECK (result IS NULL OR JSON_VALID(result)),
    error     TEXT,
    done_at   BIGINT,
    synced_at BIGINT         NOT NULL,
    PRIMARY KEY (list, created, jid)
) */;
/*sqlite INSERT INTO aq_jobs_v4 (list, created, jid, token, state, attempts, payload, result, error, done_at, synced_at)
    SELECT list, 0, jid, token, state, attempts, payload, result, error, done_at, synced_at FROM aq_jobs */;
/*sqlite DROP TABLE aq_jobs */;
/*sqlite ALTER TABLE aq_jobs_v4 RENAME TO aq_jobs */;
/*sqlite DROP TABLE IF EXISTS aq_list_summary_v4 */;
/*sqlite CREATE TABLE aq_list_summary_v4 (
    list         VARCHAR(64) NOT NULL PRIMARY KEY,
    created      BIGINT      NOT NULL DEFAULT 0,
    mode         VARCHAR(8)  NOT NULL,
    total        BIGINT      NOT NULL,
    done         BIGINT      NOT NULL,
    dead         BIGINT      NOT NULL,
    sealed       SMALLINT    NOT NULL,
    complete     SMALLINT    NOT NULL,
    completed_at BIGINT,
    updated_at   BIGINT      NOT NULL
) */;
/*sqlite INSERT INTO aq_list_summary_v4 (list, mode, total, done, dead, sealed, complete, completed_at, updated_at)
    SELECT list, mode, total, done, dead, sealed, complete, completed_at, updated_at FROM aq_list_summary */;
/*sqlite DROP TABLE aq_list_summary */;
/*sqlite ALTER TABLE aq_list_summary_v4 RENAME TO aq_list_summary */;

-- migration 5: sync_rejects carries the list's stamp; a reject is keyed (list, created, token)
-- Keyed (list, token), a list dropped and loaded again under its name shared
-- its rejects' rows with the old list: the new list's job at a token took the
-- old one's reject row, and once the new job was copied the old list's reject
-- was cleared as copied, though the old job never was. Rows of before hold
-- created 0 (the stamp unknown): a copy of a job of their (list, token) clears
-- them, and a reject of one takes their place, as before (aeroqueue.sync.task).
-- MySQL: one ALTER, run only while the column is missing (safe to run again).
/*! SET @aq_has_created = (SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'sync_rejects' AND column_name = 'created') */;
/*! SET @aq_alter = IF(@aq_has_created = 0, 'ALTER TABLE sync_rejects ADD COLUMN created BIGINT NOT NULL DEFAULT 0 AFTER list, DROP PRIMARY KEY, ADD PRIMARY KEY (list, created, token)', 'DO 0') */;
/*! PREPARE aq_migrate_5 FROM @aq_alter */;
/*! EXECUTE aq_migrate_5 */;
/*! DEALLOCATE PREPARE aq_migrate_5 */;
/*sqlite DROP TABLE IF EXISTS sync_rejects_v5 */;
/*sqlite CREATE TABLE sync_rejects_v5 (
    list    VARCHAR(64) NOT NULL,
    created BIGINT      NOT NULL DEFAULT 0,
    token   BIGINT      NOT NULL,
    jid     TEXT        NOT NULL,
    state   VARCHAR(8)  NOT NULL,
    reason  TEXT        NOT NULL,
    seen_at BIGINT      NOT NULL,
    PRIMARY KEY (list, created, token)
) */;
/*sqlite INSERT INTO sync_rejects_v5 (list, created, token, jid, state, reason, seen_at)
    SELECT list, 0, token, jid, state, reason, seen_at FROM sync_rejects */;
/*sqlite DROP TABLE sync_rejects */;
/*sqlite ALTER TABLE sync_rejects_v5 RENAME TO sync_rejects */;

-- migration 6: sync_target: one row, the id of this copy, which the marks name with the place
-- A job's mark names the target by its place (host, port, database, table):
-- a database dropped and made again there, or a new server under the old
-- name, was an empty copy that the marks said held every job, and nothing
-- told the store (rows went missing from the copy for good). The sync gives
-- a copy whose aq_jobs it makes a new random id, and the mark of a target
-- with an id is a hash of its place and the id, so a copy made anew is
-- copied into in full. A target made before this migration keeps an empty
-- id: its marks name its place alone, as they did (aeroqueue.sync.schema).
CREATE TABLE IF NOT EXISTS sync_target (
    id      VARCHAR(32) /*! CHARACTER SET ascii COLLATE ascii_bin */ NOT NULL PRIMARY KEY,
    made_at BIGINT      NOT NULL
) /*! ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 */;
