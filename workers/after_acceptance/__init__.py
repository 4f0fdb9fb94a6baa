"""After acceptance (docs/design.md §18): bounces and complaints that arrive later (reports,
mailbox, feedback), the outgoing event webhooks (event_queue, event_webhooks) and the pool's jobs
that run them (pool)."""
