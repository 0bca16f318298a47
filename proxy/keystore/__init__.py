"""Keys, tenants and admin tokens managed at run time: kept in PostgreSQL (`store`), held by every
process in memory and kept current within a second (`directory`), changed through the admin API
(`api`) and the CLI (`cli`), each change checked against the caller's role (`access`) and
written to the audit trail in the same transaction."""
