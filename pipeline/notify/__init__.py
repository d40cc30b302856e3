"""Live alerts that reach people: a rule's or category's ``notify:`` sends its alerts to webhooks, signed,
retried and dead-lettered (``AlertNotifier``, run by each worker beside its live work)."""
