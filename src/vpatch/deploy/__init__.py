"""Switch production to a new image with checks: park/start/rollback, the check suite, the journal, the report."""
