"""Delivery: the queue of jobs in PostgreSQL (queue), the worker pool that claims and sends
them (pool), the SMTP conversation (smtp), what a relay's reply means (classify), what
becomes of the job (outcomes, retry) and the campaign finisher (finisher)."""
