-- taskgate PostgreSQL schema, version 5: the tenant index behind the operator API
-- (docs/design.md §24): each tenant's tasks in one status, oldest first.
--
-- Expand-only: an index over columns every version since 4 fills (`created_at_ms`
-- by version 4's trigger for older writers). A gateway that predates it neither
-- reads nor needs it.
CREATE INDEX task_routes_tenant_status
    ON task_routes (tenant, status, created_at_ms, task_id COLLATE "C");
