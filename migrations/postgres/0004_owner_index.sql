-- taskgate PostgreSQL schema, version 4: the owner index behind `tasks/list`
-- (docs/design.md §25): each principal's tasks on one upstream, oldest first.
--
-- Expand-only: two nullable columns beside the record, copies of its `upstream` and
-- `created_at_ms` fields, and an index over them. A gateway that predates this
-- version neither reads nor fills them; the trigger below fills them from the record
-- for its inserts, so the tasks such a replica creates during a rolling upgrade are
-- listed too. A row whose columns stay NULL (a record that is not JSON) is never
-- listed, and is otherwise served as before.

ALTER TABLE task_routes ADD COLUMN upstream text, ADD COLUMN created_at_ms bigint;

-- The record is the exact bytes of serde's JSON (UTF-8): read as `json` (parsed, never
-- stored) for the two fields. Set-based first; should any record not parse, the
-- statement is undone and the rows are done one by one, each bad one left NULL.
DO $backfill$
DECLARE
    r record;
BEGIN
    BEGIN
        UPDATE task_routes
        SET upstream = convert_from(record, 'UTF8')::json ->> 'upstream',
            created_at_ms = (convert_from(record, 'UTF8')::json ->> 'created_at_ms')::bigint
        WHERE upstream IS NULL;
    EXCEPTION WHEN others THEN
        FOR r IN SELECT task_id FROM task_routes WHERE upstream IS NULL LOOP
            BEGIN
                UPDATE task_routes
                SET upstream = convert_from(record, 'UTF8')::json ->> 'upstream',
                    created_at_ms =
                        (convert_from(record, 'UTF8')::json ->> 'created_at_ms')::bigint
                WHERE task_id = r.task_id;
            EXCEPTION WHEN others THEN
                RAISE WARNING 'task_routes/%: record is not a task record; not listed',
                    r.task_id;
            END;
        END LOOP;
    END;
END
$backfill$;

-- Fills the columns of an insert that left them out (a gateway before version 4).
-- Only such inserts run it (the trigger's WHEN): this version's inserts fill them.
CREATE FUNCTION task_routes_fill_owner() RETURNS trigger LANGUAGE plpgsql AS $fill$
BEGIN
    BEGIN
        NEW.upstream := convert_from(NEW.record, 'UTF8')::json ->> 'upstream';
        NEW.created_at_ms := (convert_from(NEW.record, 'UTF8')::json ->> 'created_at_ms')::bigint;
    EXCEPTION WHEN others THEN
        NEW.upstream := NULL;
        NEW.created_at_ms := NULL;
    END;
    RETURN NEW;
END
$fill$;

CREATE TRIGGER task_routes_fill_owner BEFORE INSERT ON task_routes
    FOR EACH ROW WHEN (NEW.upstream IS NULL OR NEW.created_at_ms IS NULL)
    EXECUTE FUNCTION task_routes_fill_owner();

-- A principal's tasks on one upstream in (created_at_ms, task_id) order, task ids
-- compared as bytes ("C"), whatever the database's collation: the order sled and the
-- in-memory store page in, and the one a cursor resumes in.
CREATE INDEX task_routes_owner
    ON task_routes (tenant, subject, upstream, created_at_ms, task_id COLLATE "C");
